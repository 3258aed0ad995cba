//! The commit protocol as a user of the journal sees it, on both backends.

mod common;

use async_trait::async_trait;
use common::{Backend, proposal, refund};
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{Fingerprint, IntentState, Observation, Receipt, SemanticKey, Settlement};
use ring0_journal::{
    DispatchOutcome, Executor, FailureClass, IntentRecord, JournalError, ProbeFinding,
    ProposeDecision, RecoveryPolicy, Settled, Transition, begin_dispatch, compensate, drive,
    drive_bounded, limits::ATTEMPTS_MAX, record_outcome, recover, settle,
};
use serde_json::{Value, json};
use std::sync::Mutex;

fn receipt(text: &str) -> Receipt {
    Receipt::new(
        "c",
        0,
        "refund",
        Disposition::Dispatched,
        CallOutcome::Completed {
            observation: Observation::text(text),
        },
    )
}

fn recorded(d: ProposeDecision) -> IntentRecord {
    match d {
        ProposeDecision::Recorded(r) => r,
        other => panic!("expected Recorded, got {other:?}"),
    }
}

async fn recorded_then(b: &Backend, call: &str, states: &[IntentState]) -> IntentRecord {
    let mut r = recorded(b.journal.propose(refund(20, call)).await.unwrap());
    for &s in states {
        r = b.journal.transition(Transition::to(&r, s)).await.unwrap();
    }
    r
}

async fn new_key_is_recorded_with_an_idempotency_key_derived_from_it(b: &mut Backend) {
    let p = refund(20, "t1");
    let r = recorded(b.journal.propose(p.clone()).await.unwrap());
    assert_eq!(r.state, IntentState::Recorded);
    assert_eq!(r.idempotency_key, p.semantic_key.idempotency_key(0));
    assert_eq!(r.id.get_version_num(), 7);
    let states: Vec<_> = r.timeline.iter().map(|e| e.state).collect();
    assert_eq!(states, [IntentState::Proposed, IntentState::Recorded]);
}

async fn the_principal_of_a_call_is_recorded_with_its_intent_and_kept(b: &mut Backend) {
    let unkeyed = ring0_journal::Proposal {
        principal: Some("alice".into()),
        ..refund(20, "p1")
    };
    let keyed = ring0_journal::Proposal {
        principal: Some("bob".into()),
        client_key: Some(ring0_journal::ClientKey {
            principal: "bob".into(),
            key: "k-1".into(),
            retention_ms: 60_000,
        }),
        ..refund(30, "p2")
    };
    let a = recorded(b.journal.propose(unkeyed).await.unwrap());
    let k = recorded(b.journal.propose(keyed).await.unwrap());
    assert_eq!(a.principal.as_deref(), Some("alice"));
    assert_eq!(a.client_key, None);
    assert_eq!(k.principal.as_deref(), Some("bob"));
    b.reopen().await;
    let a = b.journal.get(a.id).await.unwrap().unwrap();
    let k = b.journal.get(k.id).await.unwrap().unwrap();
    assert_eq!(a.principal.as_deref(), Some("alice"));
    assert_eq!(a.client_key, None, "a principal alone is no caller's key");
    assert_eq!(k.principal.as_deref(), Some("bob"));
    assert_eq!(k.client_key.map(|c| c.key).as_deref(), Some("k-1"));
    assert!(ring0_journal::inspect::render_show(&a).contains("principal:       alice"));
}

async fn same_intent_in_flight_is_a_duplicate_whatever_the_call_id(b: &mut Backend) {
    use IntentState::*;
    for (i, path) in [
        vec![],
        vec![Dispatched],
        vec![Dispatched, Unknown],
        vec![Dispatched, Unknown, Reconciling],
    ]
    .into_iter()
    .enumerate()
    {
        let scope = format!("scope-{i}");
        let args = json!({"amount": 20});
        let mut r = recorded(
            b.journal
                .propose(proposal("refund", args.clone(), &scope, "t1"))
                .await
                .unwrap(),
        );
        for s in path {
            r = b.journal.transition(Transition::to(&r, s)).await.unwrap();
        }
        let again = b
            .journal
            .propose(proposal("refund", args, &scope, "fresh-id"))
            .await
            .unwrap();
        match again {
            ProposeDecision::Duplicate(d) => {
                assert_eq!((d.id, d.state), (r.id, r.state));
                assert_eq!(d.call_ids, ["t1", "fresh-id"]);
            }
            other => panic!("expected Duplicate in {}, got {other:?}", r.state),
        }
    }
}

async fn acknowledged_intent_replays_its_stored_receipt_without_dispatch(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched]).await;
    let acked = record_outcome(
        &*b.journal,
        &r,
        DispatchOutcome::Applied(receipt("refunded")),
    )
    .await
    .unwrap();
    match b.journal.propose(refund(20, "t2")).await.unwrap() {
        ProposeDecision::Replay(rec) => {
            assert_eq!(rec.id, acked.id);
            assert_eq!(rec.attempts, 1);
            let stored = rec.receipt.unwrap();
            assert_eq!(stored.state, Some(IntentState::Acked));
            assert_eq!(stored.outcome, receipt("refunded").outcome);
        }
        other => panic!("expected Replay, got {other:?}"),
    }
}

async fn host_id_bound_to_another_intent_is_a_conflict_naming_what_differs(b: &mut Backend) {
    let mut p = refund(20, "t1");
    p.intent_id = Some(uuid::Uuid::now_v7());
    b.journal.propose(p.clone()).await.unwrap();
    let mut other = refund(25, "t2");
    other.intent_id = p.intent_id;
    match b.journal.propose(other).await.unwrap() {
        ProposeDecision::Conflict { reason, existing } => {
            assert!(reason.contains("prepared arguments differ"), "{reason}");
            assert_eq!(existing.unwrap().id, p.intent_id.unwrap());
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
}

fn with_version(mut p: ring0_journal::Proposal, version: u32) -> ring0_journal::Proposal {
    p.semantic_key = SemanticKey {
        version,
        digest: p.semantic_key.digest,
    };
    p
}

async fn a_new_canonicalizer_version_for_the_same_intent_is_a_conflict_not_a_second_record(
    b: &mut Backend,
) {
    b.journal.propose(refund(20, "t1")).await.unwrap();
    match b
        .journal
        .propose(with_version(refund(20, "t2"), 2))
        .await
        .unwrap()
    {
        ProposeDecision::Conflict { reason, .. } => {
            assert!(reason.contains("canonicalizer version 1"), "{reason}");
            assert!(reason.contains("version 2"), "{reason}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
}

async fn a_new_canonicalizer_version_under_the_same_host_id_names_the_versions(b: &mut Backend) {
    let mut p = refund(20, "t1");
    p.intent_id = Some(uuid::Uuid::now_v7());
    b.journal.propose(p.clone()).await.unwrap();
    let mut v2 = with_version(refund(20, "t2"), 2);
    v2.intent_id = p.intent_id;
    match b.journal.propose(v2).await.unwrap() {
        ProposeDecision::Conflict { reason, .. } => {
            assert!(
                reason.contains("canonicalizer version 2 differs from recorded version 1"),
                "{reason}"
            );
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
}

async fn cancellation_before_dispatch_rejects_and_a_later_proposal_records_anew(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[]).await;
    let cancelled = b
        .journal
        .transition(Transition::to(&r, IntentState::RejectedConflict).note("cancelled"))
        .await
        .unwrap();
    assert_eq!(cancelled.attempts, 0);
    let again = recorded(b.journal.propose(refund(20, "t2")).await.unwrap());
    assert_ne!(again.id, r.id);
    let found = b.journal.find_by_key(&again.semantic_key).await.unwrap();
    assert_eq!(found.unwrap().id, again.id);
}

async fn a_definite_failure_may_be_recorded_again_by_a_new_proposal(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched]).await;
    let failed = record_outcome(
        &*b.journal,
        &r,
        DispatchOutcome::Failed {
            class: FailureClass::ConnectionRefused,
            receipt: receipt("refused"),
        },
    )
    .await
    .unwrap();
    assert_eq!(failed.state, IntentState::Failed);
    let again = recorded(b.journal.propose(refund(20, "t2")).await.unwrap());
    assert_eq!((again.id, again.receipt.as_ref()), (r.id, None));
}

async fn ambiguous_errors_settle_unknown_never_failed(b: &mut Backend) {
    for (i, class) in [
        FailureClass::Timeout,
        FailureClass::ConnectionLost,
        FailureClass::StreamAborted,
        FailureClass::Unknown,
    ]
    .into_iter()
    .enumerate()
    {
        let p = proposal("refund", json!({"n": i}), "s", "c");
        let r = recorded(b.journal.propose(p).await.unwrap());
        let r = begin_dispatch(&*b.journal, &r, None).await.unwrap();
        let out = DispatchOutcome::Failed {
            class,
            receipt: receipt("?"),
        };
        let settled = record_outcome(&*b.journal, &r, out).await.unwrap();
        assert_eq!(settled.state, IntentState::Unknown, "{class:?}");
    }
}

async fn a_stale_fence_cannot_overwrite_a_newer_decision(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[]).await;
    b.journal
        .transition(Transition::to(&r, IntentState::Dispatched))
        .await
        .unwrap();
    let stale = b
        .journal
        .transition(Transition::to(&r, IntentState::RejectedConflict))
        .await;
    assert!(matches!(
        stale,
        Err(JournalError::StaleFence {
            expected: 1,
            actual: 2,
            ..
        })
    ));
    let now = b.journal.get(r.id).await.unwrap().unwrap();
    assert_eq!(now.state, IntentState::Dispatched);
}

async fn unknown_is_never_dispatched_directly(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched, IntentState::Unknown]).await;
    let refused = b
        .journal
        .transition(Transition::to(&r, IntentState::Dispatched))
        .await;
    assert!(
        matches!(refused, Err(JournalError::Transition(_))),
        "{refused:?}"
    );
    assert_eq!(b.journal.get(r.id).await.unwrap().unwrap().fence, r.fence);
}

async fn dispatches_beyond_the_attempt_budget_are_refused(b: &mut Backend) {
    let mut r = recorded_then(b, "t1", &[]).await;
    for _ in 0..ATTEMPTS_MAX {
        r = b
            .journal
            .transition(Transition::to(&r, IntentState::Dispatched))
            .await
            .unwrap();
        for s in [IntentState::Unknown, IntentState::Reconciling] {
            r = b.journal.transition(Transition::to(&r, s)).await.unwrap();
        }
    }
    let more = b
        .journal
        .transition(Transition::to(&r, IntentState::Dispatched))
        .await;
    assert!(
        matches!(more, Err(JournalError::AttemptsExhausted { .. })),
        "{more:?}"
    );
    let settled = settle(&*b.journal, &r, Settlement::IdempotencyKey, None)
        .await
        .unwrap();
    assert_eq!(settled.record().state, IntentState::DeadLetter);
}

async fn idempotency_key_settlement_redispatches_with_the_same_key(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched, IntentState::Unknown]).await;
    match settle(&*b.journal, &r, Settlement::IdempotencyKey, None)
        .await
        .unwrap()
    {
        Settled::Redispatch(d) => {
            assert_eq!(d.state, IntentState::Dispatched);
            assert_eq!(d.idempotency_key, r.idempotency_key);
            assert_eq!(d.attempts, 2);
            let states: Vec<_> = d.timeline.iter().rev().take(2).map(|e| e.state).collect();
            assert_eq!(states, [IntentState::Dispatched, IntentState::Reconciling]);
        }
        other => panic!("expected Redispatch, got {other:?}"),
    }
}

async fn a_probe_that_sees_the_postcondition_acks_with_a_synthetic_receipt(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched, IntentState::Unknown]).await;
    let finding = ProbeFinding::Applied(Box::new(Observation {
        structured: Some(json!({"refund": "r-9"})),
        ..Observation::text("the refund is there")
    }));
    let s = settle(&*b.journal, &r, Settlement::Probe, Some(finding))
        .await
        .unwrap();
    let Settled::Acked(acked) = s else {
        panic!("expected Acked, got {s:?}")
    };
    let receipt = acked.receipt.unwrap();
    assert_eq!(receipt.disposition, Disposition::Recovered);
    let CallOutcome::Completed { observation } = receipt.outcome else {
        panic!("synthetic receipt is a completion")
    };
    let evidence = &observation.structured.unwrap()["evidence"];
    assert_eq!(evidence["structured"]["refund"], "r-9");
    assert_eq!(evidence["text"], "the refund is there");
}

async fn a_probe_that_sees_no_change_makes_the_intent_resumable(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[]).await;
    let r = begin_dispatch(&*b.journal, &r, Some(json!({"balance": 100})))
        .await
        .unwrap();
    let r = b
        .journal
        .transition(Transition::to(&r, IntentState::Unknown))
        .await
        .unwrap();
    let s = settle(
        &*b.journal,
        &r,
        Settlement::Probe,
        Some(ProbeFinding::Unchanged),
    )
    .await
    .unwrap();
    let Settled::Resumable(again) = s else {
        panic!("expected Resumable, got {s:?}")
    };
    assert_eq!(again.state, IntentState::Recorded);
    assert_eq!(again.snapshot, Some(json!({"balance": 100})));
}

async fn an_unchanged_finding_without_a_snapshot_is_dead_lettered(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched, IntentState::Unknown]).await;
    let s = settle(
        &*b.journal,
        &r,
        Settlement::Probe,
        Some(ProbeFinding::Unchanged),
    )
    .await
    .unwrap();
    assert!(matches!(s, Settled::DeadLetter(_)), "{s:?}");
}

async fn anything_else_goes_to_a_person(b: &mut Backend) {
    let diverged = ProbeFinding::Indeterminate("balance changed by someone else".into());
    for (i, (kind, finding)) in [
        (Settlement::Probe, Some(diverged)),
        (Settlement::Probe, None),
        (Settlement::None, None),
    ]
    .into_iter()
    .enumerate()
    {
        let p = proposal("refund", json!({"n": i}), "s", "c");
        let mut r = recorded(b.journal.propose(p).await.unwrap());
        for s in [IntentState::Dispatched, IntentState::Unknown] {
            r = b.journal.transition(Transition::to(&r, s)).await.unwrap();
        }
        let s = settle(&*b.journal, &r, kind, finding).await.unwrap();
        assert_eq!(s.record().state, IntentState::DeadLetter, "{kind:?}");
        let again = b
            .journal
            .propose(proposal("refund", json!({"n": i}), "s", "c2"))
            .await
            .unwrap();
        assert!(
            matches!(again, ProposeDecision::Conflict { .. }),
            "{again:?}"
        );
    }
}

async fn compensation_undoes_an_acked_effect_and_blocks_the_same_epoch(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[IntentState::Dispatched]).await;
    let acked = record_outcome(&*b.journal, &r, DispatchOutcome::Applied(receipt("ok")))
        .await
        .unwrap();
    let c = compensate(&*b.journal, &acked, None, "refund reversed")
        .await
        .unwrap();
    assert_eq!(c.state, IntentState::Compensated);
    let again = b.journal.propose(refund(20, "t2")).await.unwrap();
    let ProposeDecision::Conflict { reason, .. } = again else {
        panic!("expected Conflict, got {again:?}")
    };
    assert!(reason.contains("new epoch"), "{reason}");
}

/// A scripted world for `drive` and `recover`.
struct World {
    settlement: Settlement,
    applied: Mutex<u32>,
    dispatches: Mutex<Vec<String>>,
    /// Outcomes to return, in order; then success.
    script: Mutex<Vec<FailureClass>>,
}

impl World {
    fn new(settlement: Settlement, script: Vec<FailureClass>) -> Self {
        Self {
            settlement,
            applied: Mutex::new(0),
            dispatches: Mutex::new(Vec::new()),
            script: Mutex::new(script),
        }
    }
}

#[async_trait]
impl Executor for World {
    fn settlement(&self, _: &IntentRecord) -> Settlement {
        self.settlement
    }
    async fn snapshot(&self, _: &IntentRecord) -> Option<Value> {
        Some(json!(*self.applied.lock().unwrap()))
    }
    async fn dispatch(&self, r: &IntentRecord) -> DispatchOutcome {
        self.dispatches
            .lock()
            .unwrap()
            .push(r.idempotency_key.clone());
        let next = {
            let mut s = self.script.lock().unwrap();
            (!s.is_empty()).then(|| s.remove(0))
        };
        match next {
            None => {
                *self.applied.lock().unwrap() += 1;
                DispatchOutcome::Applied(receipt("ok"))
            }
            Some(class) => DispatchOutcome::Failed {
                class,
                receipt: receipt("err"),
            },
        }
    }
    async fn probe(&self, r: &IntentRecord) -> ProbeFinding {
        if Some(json!(*self.applied.lock().unwrap())) == r.snapshot {
            ProbeFinding::Unchanged
        } else {
            ProbeFinding::Applied(Box::default())
        }
    }
}

async fn drive_settles_a_lost_ack_through_the_same_idempotency_key(b: &mut Backend) {
    let world = World::new(Settlement::IdempotencyKey, vec![FailureClass::Timeout]);
    let r = recorded(b.journal.propose(refund(20, "t1")).await.unwrap());
    let done = drive(&*b.journal, &world, r.clone()).await.unwrap();
    assert_eq!(done.state, IntentState::Acked);
    assert_eq!(
        *world.dispatches.lock().unwrap(),
        vec![r.idempotency_key.clone(), r.idempotency_key.clone()]
    );
}

async fn drive_resumes_after_a_probe_finds_nothing_happened(b: &mut Backend) {
    let world = World::new(Settlement::Probe, vec![FailureClass::ConnectionLost]);
    let r = recorded(b.journal.propose(refund(20, "t1")).await.unwrap());
    let done = drive(&*b.journal, &world, r).await.unwrap();
    assert_eq!(done.state, IntentState::Acked);
    assert_eq!(*world.applied.lock().unwrap(), 1);
    let states: Vec<_> = done.timeline.iter().map(|e| e.state.as_str()).collect();
    assert_eq!(
        states.join(" "),
        "PROPOSED RECORDED DISPATCHED UNKNOWN RECONCILING RECORDED DISPATCHED ACKED"
    );
}

async fn a_spent_dispatch_budget_dead_letters_instead_of_dispatching_again(b: &mut Backend) {
    let world = World::new(Settlement::IdempotencyKey, vec![FailureClass::Timeout]);
    let r = recorded(b.journal.propose(refund(20, "t1")).await.unwrap());
    let done = drive_bounded(&*b.journal, &world, r, 1).await.unwrap();
    assert_eq!(done.state, IntentState::DeadLetter);
    assert_eq!(world.dispatches.lock().unwrap().len(), 1);
    let probe = World::new(Settlement::Probe, vec![FailureClass::ConnectionLost]);
    let r = recorded(b.journal.propose(refund(21, "t2")).await.unwrap());
    let done = drive_bounded(&*b.journal, &probe, r, 1).await.unwrap();
    assert_eq!(
        done.state,
        IntentState::DeadLetter,
        "unchanged, but no budget left"
    );
    assert_eq!(*probe.applied.lock().unwrap(), 0);
}

async fn a_bounded_drive_still_acks_what_a_probe_found(b: &mut Backend) {
    // The probe needs no dispatch: a spent budget does not stop it from settling ACKED.
    struct Applied(World);
    #[async_trait]
    impl Executor for Applied {
        fn settlement(&self, r: &IntentRecord) -> Settlement {
            self.0.settlement(r)
        }
        async fn snapshot(&self, r: &IntentRecord) -> Option<Value> {
            self.0.snapshot(r).await
        }
        async fn dispatch(&self, r: &IntentRecord) -> DispatchOutcome {
            // Applied, then the acknowledgement is lost.
            *self.0.applied.lock().unwrap() += 1;
            let _ = self.0.dispatch(r).await;
            DispatchOutcome::Failed {
                class: FailureClass::ConnectionLost,
                receipt: receipt("lost"),
            }
        }
        async fn probe(&self, r: &IntentRecord) -> ProbeFinding {
            self.0.probe(r).await
        }
    }
    let world = Applied(World::new(Settlement::Probe, vec![FailureClass::Unknown]));
    let r = recorded(b.journal.propose(refund(20, "t1")).await.unwrap());
    let done = drive_bounded(&*b.journal, &world, r, 1).await.unwrap();
    assert_eq!(done.state, IntentState::Acked);
    assert_eq!(world.0.dispatches.lock().unwrap().len(), 1);
}

async fn a_failed_read_is_failed_never_unknown(b: &mut Backend) {
    let mut p = proposal("stat", json!({"path": "a"}), "s", "c1");
    p.mutating = false;
    let r = recorded(b.journal.propose(p).await.unwrap());
    let d = begin_dispatch(&*b.journal, &r, None).await.unwrap();
    let failed = DispatchOutcome::Failed {
        class: FailureClass::Timeout,
        receipt: receipt("timed out"),
    };
    let done = record_outcome(&*b.journal, &d, failed).await.unwrap();
    assert_eq!(done.state, IntentState::Failed);
}

async fn recovery_settles_what_a_crash_left_open_from_the_log_alone(b: &mut Backend) {
    let in_flight = recorded_then(b, "t1", &[IntentState::Dispatched]).await;
    let p = proposal("refund", json!({"order": "o-2"}), "s", "t2");
    let waiting = recorded(b.journal.propose(p).await.unwrap());
    b.reopen().await;
    let world = World::new(Settlement::IdempotencyKey, vec![]);
    let report = recover(&*b.journal, &world, RecoveryPolicy::default())
        .await
        .unwrap();
    assert_eq!(
        (report.examined, report.in_flight, report.resumed),
        (2, 1, 1)
    );
    assert_eq!(report.unsettled().count(), 0);
    for id in [in_flight.id, waiting.id] {
        let r = b.journal.get(id).await.unwrap().unwrap();
        assert_eq!(r.state, IntentState::Acked);
    }
    let first = b.journal.get(in_flight.id).await.unwrap().unwrap();
    let states: Vec<_> = first.timeline.iter().map(|e| e.state.as_str()).collect();
    assert_eq!(
        states.join(" "),
        "PROPOSED RECORDED DISPATCHED UNKNOWN RECONCILING DISPATCHED ACKED"
    );
    assert!(b.journal.open_records().await.unwrap().is_empty());
}

async fn recovery_leaves_a_call_in_flight_in_this_process_to_its_owner(b: &mut Backend) {
    // Left in flight by the previous process...
    let leftover = recorded_then(b, "t1", &[IntentState::Dispatched]).await;
    b.reopen().await;
    // ...and dispatched by a live task of this one, its request still on the way.
    let p = proposal("refund", json!({"order": "o-2"}), "s", "t2");
    let live = recorded(b.journal.propose(p).await.unwrap());
    let live = begin_dispatch(&*b.journal, &live, None).await.unwrap();
    let world = World::new(Settlement::IdempotencyKey, vec![]);
    let report = recover(&*b.journal, &world, RecoveryPolicy::default())
        .await
        .unwrap();
    assert_eq!((report.in_flight, report.live), (1, 1));
    assert_eq!(
        *world.dispatches.lock().unwrap(),
        vec![leftover.idempotency_key.clone()]
    );
    let still = b.journal.get(live.id).await.unwrap().unwrap();
    assert_eq!(
        (still.state, still.fence),
        (IntentState::Dispatched, live.fence)
    );
}

async fn a_record_this_incarnation_holds_is_left_to_its_live_task_by_recovery(b: &mut Backend) {
    // Recorded and never dispatched by the previous process...
    let leftover = recorded_then(b, "t1", &[]).await;
    b.reopen().await;
    // ...beside calls of live tasks of this one: one just recorded (its task dispatches it
    // next), one whose outcome was lost (its task settles it).
    let p = proposal("refund", json!({"order": "o-2"}), "s", "t2");
    let waiting = recorded(b.journal.propose(p).await.unwrap());
    let p = proposal("refund", json!({"order": "o-3"}), "s", "t3");
    let lost = recorded(b.journal.propose(p).await.unwrap());
    let lost = begin_dispatch(&*b.journal, &lost, None).await.unwrap();
    let lost = b
        .journal
        .transition(Transition::to(&lost, IntentState::Unknown))
        .await
        .unwrap();
    let world = World::new(Settlement::IdempotencyKey, vec![]);
    let report = recover(&*b.journal, &world, RecoveryPolicy::default())
        .await
        .unwrap();
    assert_eq!(report.resumed, 1);
    assert_eq!(
        *world.dispatches.lock().unwrap(),
        vec![leftover.idempotency_key.clone()]
    );
    for live in [&waiting, &lost] {
        let still = b.journal.get(live.id).await.unwrap().unwrap();
        assert_eq!((still.state, still.fence), (live.state, live.fence));
    }
}

async fn recovery_may_cancel_what_was_never_dispatched(b: &mut Backend) {
    let r = recorded_then(b, "t1", &[]).await;
    b.reopen().await;
    let world = World::new(Settlement::None, vec![]);
    let policy = RecoveryPolicy {
        resume_recorded: false,
    };
    let report = recover(&*b.journal, &world, policy).await.unwrap();
    assert_eq!(report.cancelled, 1);
    assert!(world.dispatches.lock().unwrap().is_empty());
    let r = b.journal.get(r.id).await.unwrap().unwrap();
    assert_eq!(r.state, IntentState::RejectedConflict);
}

async fn decisions_after_reopening_are_the_decisions_before(b: &mut Backend) {
    use IntentState::*;
    let scopes = ["a", "b", "c", "d"];
    let paths: [&[IntentState]; 4] = [
        &[],
        &[Dispatched],
        &[Dispatched, Acked],
        &[RejectedConflict],
    ];
    for (scope, path) in scopes.iter().zip(paths) {
        let p = proposal("t", json!({}), scope, "c1");
        let mut r = recorded(b.journal.propose(p).await.unwrap());
        for &s in path {
            r = b.journal.transition(Transition::to(&r, s)).await.unwrap();
        }
    }
    let mut before = Vec::new();
    for scope in scopes {
        let d = b
            .journal
            .propose(proposal("t", json!({}), scope, "c2"))
            .await
            .unwrap();
        before.push((d.kind(), d.record().map(|r| (r.state, r.fence))));
    }
    b.reopen().await;
    let mut after = Vec::new();
    for scope in scopes {
        let d = b
            .journal
            .propose(proposal("t", json!({}), scope, "c3"))
            .await
            .unwrap();
        after.push((d.kind(), d.record().map(|r| (r.state, r.fence))));
    }
    // The fourth was recorded anew by the first round, so the second sees it in flight.
    assert_eq!(before[..3], after[..3]);
    assert_eq!(before[3].0, "recorded");
    assert_eq!(after[3].0, "duplicate");
}

async fn reads_are_recorded_but_never_deduplicated(b: &mut Backend) {
    let mut p = proposal("stat", json!({"path": "a"}), "s", "c1");
    p.mutating = false;
    let first = recorded(b.journal.propose(p.clone()).await.unwrap());
    let second = recorded(b.journal.propose(p.clone()).await.unwrap());
    assert_ne!(first.id, second.id);
    assert_eq!(b.journal.find_by_key(&p.semantic_key).await.unwrap(), None);
}

async fn oversized_arguments_are_refused_before_anything_is_written(b: &mut Backend) {
    let big = "x".repeat(ring0_journal::limits::ARGS_BYTES_MAX);
    let p = proposal("t", json!({ "blob": big }), "s", "c");
    let err = b.journal.propose(p).await.unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::TooLarge {
                what: "canonical arguments",
                ..
            }
        ),
        "{err}"
    );
    assert!(b.journal.recent(10).await.unwrap().is_empty());
}

async fn memoized_reads_are_served_byte_identical_within_their_ttl(b: &mut Backend) {
    let fp = Fingerprint::compute("stat", &json!({"path": "a"})).unwrap();
    let obs = Observation::json(json!({"size": 12, "name": "a"}));
    assert!(b.journal.memo_put(&fp, &obs).await.unwrap());
    b.clock.advance_ms(1_000);
    let hit = b.journal.memo_get(&fp, 1_000).await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_string(&hit).unwrap(),
        serde_json::to_string(&obs).unwrap()
    );
    b.clock.advance_ms(1);
    assert_eq!(b.journal.memo_get(&fp, 1_000).await.unwrap(), None);
}

on_both_backends!(
    new_key_is_recorded_with_an_idempotency_key_derived_from_it,
    the_principal_of_a_call_is_recorded_with_its_intent_and_kept,
    same_intent_in_flight_is_a_duplicate_whatever_the_call_id,
    acknowledged_intent_replays_its_stored_receipt_without_dispatch,
    host_id_bound_to_another_intent_is_a_conflict_naming_what_differs,
    a_new_canonicalizer_version_for_the_same_intent_is_a_conflict_not_a_second_record,
    a_new_canonicalizer_version_under_the_same_host_id_names_the_versions,
    cancellation_before_dispatch_rejects_and_a_later_proposal_records_anew,
    a_definite_failure_may_be_recorded_again_by_a_new_proposal,
    ambiguous_errors_settle_unknown_never_failed,
    a_stale_fence_cannot_overwrite_a_newer_decision,
    unknown_is_never_dispatched_directly,
    dispatches_beyond_the_attempt_budget_are_refused,
    idempotency_key_settlement_redispatches_with_the_same_key,
    a_probe_that_sees_the_postcondition_acks_with_a_synthetic_receipt,
    a_probe_that_sees_no_change_makes_the_intent_resumable,
    an_unchanged_finding_without_a_snapshot_is_dead_lettered,
    anything_else_goes_to_a_person,
    compensation_undoes_an_acked_effect_and_blocks_the_same_epoch,
    drive_settles_a_lost_ack_through_the_same_idempotency_key,
    drive_resumes_after_a_probe_finds_nothing_happened,
    a_spent_dispatch_budget_dead_letters_instead_of_dispatching_again,
    a_bounded_drive_still_acks_what_a_probe_found,
    a_failed_read_is_failed_never_unknown,
    recovery_settles_what_a_crash_left_open_from_the_log_alone,
    recovery_leaves_a_call_in_flight_in_this_process_to_its_owner,
    a_record_this_incarnation_holds_is_left_to_its_live_task_by_recovery,
    recovery_may_cancel_what_was_never_dispatched,
    decisions_after_reopening_are_the_decisions_before,
    reads_are_recorded_but_never_deduplicated,
    oversized_arguments_are_refused_before_anything_is_written,
    memoized_reads_are_served_byte_identical_within_their_ttl,
);
