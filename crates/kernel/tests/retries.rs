//! Retries versus repeats: one effect per logical call, and genuine repeats that run.
//!
//! The identity of a logical call is (principal, scope, tool, prepared arguments, attempt); an
//! explicit idempotency key replaces the scope. Effects are counted with the recorder tool.

mod common;
use async_trait::async_trait;
use common::*;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{IntentState, Principal, ProposedCall, Receipt};
use ring0_journal::{Journal, ManualClock, MemoryJournal, SqliteJournal};
use ring0_kernel::{
    AuthAdmission, AuthDecision, AuthRequest, Authorizer, Kernel, RoundOptions, RoundOutcome,
    SessionConfig, SessionInfo,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn status(r: &Receipt) -> Option<RejectionKind> {
    match &r.outcome {
        CallOutcome::Rejected { rejection } => Some(rejection.status),
        _ => None,
    }
}

fn rejection_intent(r: &Receipt) -> Option<String> {
    match &r.outcome {
        CallOutcome::Rejected { rejection } => rejection.intent_id.clone(),
        _ => None,
    }
}

fn write(tag: &str) -> ProposedCall {
    call(0, "write", json!({"tag": tag}))
}

fn keyed(tag: &str, key: &str) -> ProposedCall {
    ProposedCall {
        idempotency_key: Some(key.into()),
        ..write(tag)
    }
}

async fn once(kernel: &Kernel, config: SessionConfig, c: ProposedCall) -> RoundOutcome {
    kernel
        .open_session(config)
        .run_round(round(vec![c]), &RoundOptions::default())
        .await
}

fn as_principal(scope: &str, id: &str) -> SessionConfig {
    SessionConfig::new(scope).principal(Principal::new(id))
}

#[tokio::test]
async fn an_identical_write_whose_result_was_delivered_runs_again() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let first = once(&kernel, SessionConfig::new("s"), write("a")).await;
    first.delivered();
    let second = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(second.receipts[0].disposition, Disposition::Dispatched);
    assert_eq!(rec.calls(), 2, "a genuine repeat is a second effect");
    // A new attempt: its own intent and provider idempotency key.
    assert_ne!(first.receipts[0].intent_id, second.receipts[0].intent_id);
    assert_ne!(
        first.receipts[0].idempotency_key,
        second.receipts[0].idempotency_key
    );
}

#[tokio::test]
async fn an_identical_write_whose_result_was_never_delivered_is_answered_with_it() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let first = once(&kernel, SessionConfig::new("s"), write("a")).await;
    // The response was dropped: nobody marked the ticket.
    assert!(first.delivery(0).is_some());
    let retry = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(retry.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(retry.receipts[0].intent_id, first.receipts[0].intent_id);
    assert_eq!(rec.calls(), 1);
    // The replay delivered is the delivery of that result: the next identical call runs.
    retry.delivered();
    once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn reads_always_run() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    for _ in 0..2 {
        let out = once(
            &kernel,
            SessionConfig::new("s"),
            call(0, "read", json!({"tag": "r"})),
        )
        .await;
        assert_eq!(out.receipts[0].disposition, Disposition::Dispatched);
        assert!(
            out.delivery(0).is_none(),
            "a read has no result to deduplicate"
        );
    }
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn a_keyed_retry_is_answered_with_the_recorded_result_even_after_delivery() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let first = once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
    first.delivered();
    let retry = once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
    assert_eq!(retry.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn a_key_reused_with_other_arguments_is_an_idempotency_conflict() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let first = once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
    let other = once(&kernel, SessionConfig::new("s"), keyed("b", "k-1")).await;
    assert_eq!(
        status(&other.receipts[0]),
        Some(RejectionKind::IdempotencyConflict)
    );
    assert_eq!(
        rejection_intent(&other.receipts[0]),
        first.receipts[0].intent_id
    );
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn a_key_finds_its_call_from_another_scope_of_the_same_principal_only() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    once(&kernel, as_principal("conn-1", "alice"), keyed("a", "k-1")).await;
    // A reconnect with a new scope and the same key: the same call.
    let again = once(&kernel, as_principal("conn-2", "alice"), keyed("a", "k-1")).await;
    assert_eq!(again.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(rec.calls(), 1);
    // Another principal's key of the same name is its own: never answered with alice's result.
    let bob = once(&kernel, as_principal("conn-1", "bob"), keyed("a", "k-1")).await;
    assert_eq!(bob.receipts[0].disposition, Disposition::Dispatched);
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn principals_never_share_an_intent_even_in_a_scope_of_the_same_name() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    once(&kernel, as_principal("s", "alice"), write("a")).await;
    let bob = once(&kernel, as_principal("s", "bob"), write("a")).await;
    assert_eq!(bob.receipts[0].disposition, Disposition::Dispatched);
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn a_key_is_forgotten_after_its_retention() {
    let rec = Recorder::new();
    let clock = Arc::new(ManualClock::new(1_000));
    let kernel = recorder_kernel(&rec)
        .journal(Arc::new(MemoryJournal::with_clock(clock.clone())))
        .idempotency_key_retention_ms(60_000)
        .build();
    once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
    clock.advance_ms(59_999);
    let within = once(&kernel, SessionConfig::new("s"), keyed("b", "k-1")).await;
    assert_eq!(
        status(&within.receipts[0]),
        Some(RejectionKind::IdempotencyConflict)
    );
    clock.advance_ms(1);
    let after = once(&kernel, SessionConfig::new("s"), keyed("b", "k-1")).await;
    assert_eq!(after.receipts[0].disposition, Disposition::Dispatched);
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn a_malformed_key_is_refused_before_anything_runs() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    for bad in [String::new(), "k\n1".into(), "é".into(), "k".repeat(257)] {
        let out = once(&kernel, SessionConfig::new("s"), keyed("a", &bad)).await;
        assert_eq!(
            status(&out.receipts[0]),
            Some(RejectionKind::InvalidIdempotencyKey)
        );
    }
    assert_eq!(rec.calls(), 0);
}

#[tokio::test]
async fn the_sqlite_journal_keeps_keys_and_deliveries_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.db");
    let rec = Recorder::new();
    let open = || -> Arc<dyn Journal> { Arc::new(SqliteJournal::open(&path).unwrap()) };
    {
        let kernel = recorder_kernel(&rec).journal(open()).build();
        once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
        once(&kernel, SessionConfig::new("s"), write("delivered"))
            .await
            .delivered();
        once(&kernel, SessionConfig::new("s"), write("dropped")).await;
    }
    let kernel = recorder_kernel(&rec).journal(open()).build();
    kernel.recover().await.unwrap();
    assert_eq!(rec.calls(), 3);
    let keyed_retry = once(&kernel, SessionConfig::new("other"), keyed("a", "k-1")).await;
    assert_eq!(keyed_retry.receipts[0].disposition, Disposition::Replayed);
    let dropped = once(&kernel, SessionConfig::new("s"), write("dropped")).await;
    assert_eq!(dropped.receipts[0].disposition, Disposition::Replayed);
    let delivered = once(&kernel, SessionConfig::new("s"), write("delivered")).await;
    assert_eq!(delivered.receipts[0].disposition, Disposition::Dispatched);
    assert_eq!(rec.calls(), 4);
}

#[tokio::test]
async fn an_identical_call_in_flight_past_the_wait_is_in_progress() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).in_flight_wait_ms(0).build();
    let a = kernel.open_session(SessionConfig::new("s"));
    let mut events = a.subscribe();
    let slow = call(0, "write", json!({"tag": "w", "delay_ms": 400}));
    let first = tokio::spawn({
        let slow = slow.clone();
        async move {
            a.run_round(round(vec![slow]), &RoundOptions::default())
                .await
        }
    });
    while !matches!(
        events.recv().await.unwrap(),
        ring0_kernel::Event::CallStarted { .. }
    ) {}
    let second = once(&kernel, SessionConfig::new("s"), slow).await;
    assert_eq!(status(&second.receipts[0]), Some(RejectionKind::InProgress));
    let first = first.await.unwrap();
    assert_eq!(
        rejection_intent(&second.receipts[0]),
        first.receipts[0].intent_id
    );
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn equal_conflict_keys_of_two_concurrent_sessions_of_one_scope_run_one_after_another() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let mut tasks = Vec::new();
    for n in 0..4 {
        let session = kernel.open_session(SessionConfig::new("s"));
        tasks.push(tokio::spawn(async move {
            let c = call(
                0,
                "keyed_write",
                json!({"tag": format!("t{n}"), "key": "A", "delay_ms": 30}),
            );
            session
                .run_round(round(vec![c]), &RoundOptions::default())
                .await
        }));
    }
    for t in tasks {
        assert!(!t.await.unwrap().receipts[0].is_error());
    }
    assert_eq!(rec.calls(), 4);
    assert_eq!(
        rec.key_overlap.load(Ordering::SeqCst),
        0,
        "never two at once"
    );
}

#[tokio::test]
async fn an_unknown_write_blocks_later_writes_of_the_scope_from_any_session() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let unknown = once(
        &kernel,
        SessionConfig::new("s"),
        call(0, "write", json!({"tag": "x", "fail": "unknown"})),
    )
    .await;
    assert_eq!(unknown.receipts[0].state, Some(IntentState::DeadLetter));
    let later = once(
        &kernel,
        SessionConfig::new("s"),
        call(0, "keyed_write", json!({"tag": "y", "key": "B"})),
    )
    .await;
    assert_eq!(
        status(&later.receipts[0]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    assert_eq!(
        rejection_intent(&later.receipts[0]),
        unknown.receipts[0].intent_id
    );
    // Another scope is not blocked.
    let elsewhere = once(&kernel, SessionConfig::new("t"), write("z")).await;
    assert!(!elsewhere.receipts[0].is_error());
}

#[tokio::test]
async fn a_keyed_retry_of_an_acknowledged_write_is_replayed_while_another_write_is_unsettled() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let done = once(&kernel, SessionConfig::new("s"), keyed("a", "k-a")).await;
    assert!(!done.receipts[0].is_error());
    let unknown = once(
        &kernel,
        SessionConfig::new("s"),
        call(0, "write", json!({"tag": "x", "fail": "unknown"})),
    )
    .await;
    assert_eq!(unknown.receipts[0].state, Some(IntentState::DeadLetter));
    let retry = once(&kernel, SessionConfig::new("s"), keyed("a", "k-a")).await;
    assert_eq!(retry.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(retry.receipts[0].intent_id, done.receipts[0].intent_id);
    // A new write is still blocked, and its refused claim does not count as run.
    let fresh = once(&kernel, SessionConfig::new("s"), keyed("b", "k-b")).await;
    assert_eq!(
        status(&fresh.receipts[0]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    assert_eq!(rec.calls(), 2, "the first write and the unknown one only");
}

#[tokio::test]
async fn a_settled_unknown_write_no_longer_blocks() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let unknown = once(
        &kernel,
        SessionConfig::new("s"),
        call(
            0,
            "keyed_write",
            json!({"tag": "x", "key": "A", "fail": "unknown"}),
        ),
    )
    .await;
    let id: uuid::Uuid = unknown.receipts[0]
        .intent_id
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    let record = kernel.journal().get(id).await.unwrap().unwrap();
    // A person settles it.
    kernel
        .journal()
        .transition(ring0_journal::Transition::to(&record, IntentState::Failed))
        .await
        .unwrap();
    let later = once(
        &kernel,
        SessionConfig::new("s"),
        call(0, "keyed_write", json!({"tag": "y", "key": "A"})),
    )
    .await;
    assert!(!later.receipts[0].is_error());
}

/// Holds every call for a person and counts how often one was asked.
struct CountingApprover {
    holds: AtomicUsize,
    approve: bool,
}

#[async_trait]
impl Authorizer for CountingApprover {
    async fn authorize(&self, _r: &AuthRequest<'_>) -> AuthDecision {
        unreachable!("the kernel asks admit, then hold")
    }
    async fn admit(&self, _r: &AuthRequest<'_>) -> AuthAdmission {
        AuthAdmission::Hold
    }
    async fn hold(&self, _r: &AuthRequest<'_>) -> AuthDecision {
        self.holds.fetch_add(1, Ordering::SeqCst);
        if self.approve {
            AuthDecision::Allow {
                rule: "person".into(),
            }
        } else {
            AuthDecision::ApprovalDenied {
                rule: "person".into(),
                reason: "no".into(),
            }
        }
    }
    fn visible(&self, _s: &SessionInfo, _spec: &ring0_core::ToolSpec) -> bool {
        true
    }
}

fn held_kernel(rec: &Arc<Recorder>, approve: bool) -> (Kernel, Arc<CountingApprover>) {
    let approver = Arc::new(CountingApprover {
        holds: AtomicUsize::new(0),
        approve,
    });
    (
        recorder_kernel(rec).authorizer(approver.clone()).build(),
        approver,
    )
}

#[tokio::test]
async fn a_replayed_call_is_never_shown_to_a_person() {
    let rec = Recorder::new();
    let (kernel, approver) = held_kernel(&rec, true);
    let first = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(first.receipts[0].disposition, Disposition::Dispatched);
    let replay = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(replay.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(approver.holds.load(Ordering::SeqCst), 1);
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn a_refused_call_is_never_shown_to_a_person() {
    let rec = Recorder::new();
    let (kernel, approver) = held_kernel(&rec, true);
    once(&kernel, SessionConfig::new("s"), keyed("a", "k-1")).await;
    let conflict = once(&kernel, SessionConfig::new("s"), keyed("b", "k-1")).await;
    assert_eq!(
        status(&conflict.receipts[0]),
        Some(RejectionKind::IdempotencyConflict)
    );
    let blocked_first = once(
        &kernel,
        SessionConfig::new("t"),
        call(0, "write", json!({"tag": "x", "fail": "unknown"})),
    )
    .await;
    assert_eq!(
        blocked_first.receipts[0].state,
        Some(IntentState::DeadLetter)
    );
    let blocked = once(&kernel, SessionConfig::new("t"), write("y")).await;
    assert_eq!(
        status(&blocked.receipts[0]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    // Asked for the first keyed call and the unknown write only.
    assert_eq!(approver.holds.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_denied_approval_closes_the_claim_so_a_later_identical_call_can_run() {
    let rec = Recorder::new();
    let (kernel, approver) = held_kernel(&rec, false);
    let denied = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(
        status(&denied.receipts[0]),
        Some(RejectionKind::ApprovalDenied)
    );
    assert!(denied.delivery(0).is_none());
    let again = once(&kernel, SessionConfig::new("s"), write("a")).await;
    assert_eq!(
        status(&again.receipts[0]),
        Some(RejectionKind::ApprovalDenied)
    );
    // Asked again: the denied claim did not stand in the way, and nothing ran.
    assert_eq!(approver.holds.load(Ordering::SeqCst), 2);
    assert_eq!(rec.calls(), 0);
}

/// A write that blocks until released, and reports whether it saw its call cancelled (as an
/// upstream request does when cancelled on the wire: its outcome then unknown).
struct GatedWrite {
    runs: AtomicUsize,
    started: tokio::sync::Notify,
    release: tokio::sync::Semaphore,
    stop_on_cancel: bool,
}

impl GatedWrite {
    fn new(stop_on_cancel: bool) -> Arc<Self> {
        Arc::new(Self {
            runs: AtomicUsize::new(0),
            started: tokio::sync::Notify::new(),
            release: tokio::sync::Semaphore::new(0),
            stop_on_cancel,
        })
    }
}

#[async_trait]
impl ring0_kernel::Tool for GatedWrite {
    fn on_cancel(&self) -> ring0_kernel::OnCancel {
        if self.stop_on_cancel {
            ring0_kernel::OnCancel::Stop
        } else {
            ring0_kernel::OnCancel::Finish
        }
    }

    async fn call(
        &self,
        ctx: ring0_kernel::CallContext,
        args: serde_json::Value,
    ) -> Result<ring0_core::Observation, ring0_kernel::ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.started.notify_one();
        tokio::select! {
            permit = self.release.acquire() => {
                permit.expect("gate open").forget();
                Ok(ring0_core::Observation::json(json!({"tag": args["tag"]})))
            }
            _ = ctx.cancel.cancelled() => {
                Err(ring0_kernel::ToolError::unknown("cancelled after it was sent"))
            }
        }
    }
}

fn gated_kernel(tool: &Arc<GatedWrite>) -> Kernel {
    use ring0_core::{Authority, Effect, Strategy, ToolSpec};
    let spec = ToolSpec::new(
        "gated",
        "a write that waits for its gate",
        recorder_schema(),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A1)
    .strategy(&[Strategy::Exploitation]);
    Kernel::builder()
        .tool(spec, tool.clone() as Arc<dyn ring0_kernel::Tool>)
        .unwrap()
        .authorizer(Arc::new(ring0_kernel::GrantTable::allow(
            &["*"],
            Authority::A2,
        )))
        .build()
}

/// Runs `c` in a new session of scope "s", in its own task; returns the session too, to cancel.
fn spawn_round(
    kernel: &Arc<Kernel>,
    c: ProposedCall,
) -> (
    Arc<ring0_kernel::Session>,
    tokio::task::JoinHandle<RoundOutcome>,
) {
    let session = Arc::new(kernel.open_session(SessionConfig::new("s")));
    let s = session.clone();
    let run =
        tokio::spawn(async move { s.run_round(round(vec![c]), &RoundOptions::default()).await });
    (session, run)
}

#[tokio::test]
async fn a_write_cancelled_after_dispatch_finishes_and_its_retry_gets_the_result() {
    for key in [None, Some("k-cancelled")] {
        let tool = GatedWrite::new(false);
        let kernel = Arc::new(gated_kernel(&tool));
        let c = ProposedCall {
            idempotency_key: key.map(str::to_string),
            ..call(0, "gated", json!({"tag": "sent"}))
        };
        let (session, first) = spawn_round(&kernel, c.clone());
        tool.started.notified().await;
        // The client gives up on the answer: the call was already sent.
        session.cancel();
        let (_, retry) = spawn_round(&kernel, c);
        tool.release.add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(
            first.receipts[0].state,
            Some(IntentState::Acked),
            "{key:?}: the dispatched call finishes: {:?}",
            first.receipts[0]
        );
        let retry = retry.await.unwrap();
        assert_eq!(
            retry.receipts[0].disposition,
            Disposition::Replayed,
            "{key:?}"
        );
        assert_eq!(retry.receipts[0].intent_id, first.receipts[0].intent_id);
        match &retry.receipts[0].outcome {
            CallOutcome::Completed { observation } => {
                assert_eq!(observation.structured.as_ref().unwrap()["tag"], "sent")
            }
            other => panic!("{key:?}: the retry gets the result, not {other:?}"),
        }
        assert_eq!(tool.runs.load(Ordering::SeqCst), 1, "{key:?}: one effect");
    }
}

#[tokio::test]
async fn a_tool_that_stops_on_cancellation_is_told_and_nothing_new_starts() {
    let tool = GatedWrite::new(true);
    let kernel = Arc::new(gated_kernel(&tool));
    let session = Arc::new(kernel.open_session(SessionConfig::new("s")));
    let s = session.clone();
    let run = tokio::spawn(async move {
        s.run_round(
            round(vec![
                call(0, "gated", json!({"tag": "running"})),
                ProposedCall {
                    index: 1,
                    call_id: "call_1".into(),
                    ..call(0, "gated", json!({"tag": "later"}))
                },
            ]),
            &RoundOptions::default(),
        )
        .await
    });
    tool.started.notified().await;
    session.cancel();
    // Never released: only the cancellation ends the running call.
    let out = run.await.unwrap();
    match &out.receipts[0].outcome {
        CallOutcome::Failed { message, .. } => {
            assert!(message.contains("cancelled after it was sent"), "{message}")
        }
        other => panic!("the stopped call reports its cancellation, not {other:?}"),
    }
    assert_eq!(status(&out.receipts[1]), Some(RejectionKind::Cancelled));
    assert_eq!(tool.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retries_under_one_idempotency_key_are_not_counted_as_repeats() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let mut events = session.subscribe();
    // Past the repeat guard's termination count: each is the same request sent again.
    for _ in 0..10 {
        let out = session
            .run_round(
                round(vec![keyed("a", "k-retried")]),
                &RoundOptions::default(),
            )
            .await;
        assert_eq!(status(&out.receipts[0]), None, "{:?}", out.receipts[0]);
    }
    assert_eq!(rec.calls(), 1, "one effect");
    while let Ok(event) = events.try_recv() {
        assert!(
            !matches!(event, ring0_kernel::Event::RepeatDetected { .. }),
            "a retry is not a repeat: {event:?}"
        );
    }
}
