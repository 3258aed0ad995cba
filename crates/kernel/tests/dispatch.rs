//! Plan, commit, dispatch and settle: epochs, bounds, conflict keys, uncertainty, isolation,
//! cancellation and the journal's decisions.

mod common;

use async_trait::async_trait;
use common::*;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::{CallOutcome, Disposition};
use ring0_core::{Authority, Effect, IntentState, Observation, Settlement, Strategy, ToolSpec};
use ring0_journal::{Journal, MemoryJournal};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, ProbeFinding, RoundOptions, SchedulingMode, SessionConfig,
    Tool, ToolError,
};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

fn status(r: &ring0_core::Receipt) -> Option<RejectionKind> {
    match &r.outcome {
        CallOutcome::Rejected { rejection } => Some(rejection.status),
        _ => None,
    }
}

fn tag(t: &str) -> Value {
    json!({"tag": t})
}

#[tokio::test]
async fn results_come_back_in_source_order_and_events_in_completion_order() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let mut events = session.subscribe();
    let out = session
        .run_round(
            round(vec![
                call(0, "read", json!({"tag": "slow", "delay_ms": 200})),
                call(1, "read", json!({"tag": "fast"})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    let ids: Vec<&str> = out.results.iter().map(|r| r.call_id.as_str()).collect();
    assert_eq!(ids, vec!["call_0", "call_1"]);
    let mut finished = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let ring0_kernel::Event::CallFinished { call_id, .. } = e {
            finished.push(call_id);
        }
    }
    assert_eq!(finished, vec!["call_1".to_string(), "call_0".to_string()]);
}

/// Two calls that can only both finish if they run at the same time.
struct Rendezvous(Arc<tokio::sync::Barrier>);

#[async_trait]
impl Tool for Rendezvous {
    async fn call(&self, _ctx: CallContext, _args: Value) -> Result<Observation, ToolError> {
        self.0.wait().await;
        Ok(Observation::text("met"))
    }
}

fn rendezvous_kernel(read_only: bool) -> Kernel {
    let spec = if read_only {
        ToolSpec::read(
            "meet",
            "",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        )
    } else {
        ToolSpec::new(
            "meet",
            "",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        )
        .effect(Effect::Idempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation])
    }
    .timeout_ms(2_000);
    Kernel::builder()
        .tool(
            spec,
            Arc::new(Rendezvous(Arc::new(tokio::sync::Barrier::new(2)))),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
        .build()
}

#[tokio::test]
async fn safe_parallel_overlaps_consecutive_reads() {
    let session = rendezvous_kernel(true).open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![
                call(0, "meet", json!({"n": 1})),
                call(1, "meet", json!({"n": 2})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert!(
        out.receipts.iter().all(|r| !r.is_error()),
        "both met: they overlapped"
    );
}

#[tokio::test]
async fn safe_parallel_runs_writes_as_barriers() {
    // Two writes waiting for each other can never meet when they are barriers: both time out.
    let session = rendezvous_kernel(false).open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![
                call(0, "meet", json!({"n": 1})),
                call(1, "meet", json!({"n": 2})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert!(out.receipts[0].is_error());
    // The first write's outcome is unknown (it timed out), so the second is blocked, not run.
    assert_eq!(
        status(&out.receipts[1]),
        Some(RejectionKind::BlockedByUnsettled)
    );
}

#[tokio::test]
async fn parallel_mode_overlaps_writes() {
    let session = rendezvous_kernel(false)
        .open_session(SessionConfig::new("s").mode(SchedulingMode::Parallel));
    let out = session
        .run_round(
            round(vec![
                call(0, "meet", json!({"n": 1})),
                call(1, "meet", json!({"n": 2})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert!(out.receipts.iter().all(|r| !r.is_error()));
}

#[tokio::test]
async fn max_concurrent_tools_bounds_every_epoch() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s").max_concurrent_tools(3));
    let calls = (0..12)
        .map(|i| call(i, "read", json!({"tag": format!("r{i}"), "delay_ms": 20})))
        .collect();
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    assert!(out.receipts.iter().all(|r| !r.is_error()));
    let max = rec.max_running.load(Ordering::SeqCst);
    assert!((1..=3).contains(&max), "max running {max}");
}

#[tokio::test]
async fn equal_conflict_keys_serialize_in_source_order() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let calls = vec![
        call(
            0,
            "parallel_write",
            json!({"tag": "a1", "key": "A", "delay_ms": 30}),
        ),
        call(
            1,
            "parallel_write",
            json!({"tag": "b1", "key": "B", "delay_ms": 30}),
        ),
        call(2, "parallel_write", json!({"tag": "a2", "key": "A"})),
    ];
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    assert!(out.receipts.iter().all(|r| !r.is_error()));
    assert_eq!(rec.key_overlap.load(Ordering::SeqCst), 0);
    let log = rec.log();
    let pos = |m: &Mark| log.iter().position(|x| x == m).unwrap();
    assert!(
        pos(&Mark::End { index: "a1".into() })
            < pos(&Mark::Start {
                index: "a2".into(),
                key: Some("A".into())
            })
    );
}

#[tokio::test]
async fn uncertain_keyed_write_blocks_later_writes_with_that_key_only() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let calls = vec![
        call(
            0,
            "keyed_write",
            json!({"tag": "x", "key": "A", "fail": "unknown"}),
        ),
        call(1, "keyed_write", json!({"tag": "y", "key": "B"})),
        call(2, "keyed_write", json!({"tag": "z", "key": "A"})),
        call(3, "read", json!({"tag": "r"})),
    ];
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    // No settlement declared: a person must decide.
    assert_eq!(out.receipts[0].state, Some(IntentState::DeadLetter));
    assert_eq!(out.receipts[1].state, Some(IntentState::Acked));
    assert_eq!(
        status(&out.receipts[2]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    assert_eq!(
        out.receipts[3].state,
        Some(IntentState::Acked),
        "reads are never blocked"
    );
}

#[tokio::test]
async fn uncertain_unkeyed_write_blocks_every_later_write() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let calls = vec![
        call(0, "write", json!({"tag": "x", "fail": "unknown"})),
        call(1, "keyed_write", json!({"tag": "y", "key": "B"})),
        call(2, "write", json!({"tag": "z"})),
        call(3, "read", json!({"tag": "r"})),
    ];
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    assert_eq!(
        status(&out.receipts[1]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    assert_eq!(
        status(&out.receipts[2]),
        Some(RejectionKind::BlockedByUnsettled)
    );
    assert_eq!(out.receipts[3].state, Some(IntentState::Acked));
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn a_definite_failure_is_failed_and_blocks_nothing() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let calls = vec![
        call(0, "write", json!({"tag": "x", "fail": "not_applied"})),
        call(1, "write", json!({"tag": "y"})),
    ];
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Failed));
    assert_eq!(out.receipts[1].state, Some(IntentState::Acked));
}

#[tokio::test]
async fn a_failed_read_is_never_ambiguous() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![call(
                0,
                "read",
                json!({"tag": "x", "fail": "unknown"}),
            )]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Failed));
}

#[tokio::test]
async fn a_timeout_or_a_panic_fails_one_call_and_keeps_the_others() {
    let rec = Recorder::new();
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read("read", "", recorder_schema()).timeout_ms(100),
            Arc::new(RecorderTool(rec.clone())),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let calls = vec![
        call(0, "read", json!({"tag": "hang", "fail": "hang"})),
        call(1, "read", json!({"tag": "boom", "fail": "panic"})),
        call(2, "read", json!({"tag": "fine"})),
    ];
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    match &out.receipts[0].outcome {
        CallOutcome::Failed { message, .. } => assert!(message.contains("timed out"), "{message}"),
        other => panic!("{other:?}"),
    }
    match &out.receipts[1].outcome {
        CallOutcome::Failed { message, .. } => assert!(message.contains("crashed"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(out.receipts[2].state, Some(IntentState::Acked));
    assert_eq!(
        out.results[2].content["outcome"]["observation"]["structured"]["tag"],
        "fine"
    );
}

#[tokio::test]
async fn cancellation_never_starts_another_epoch() {
    let rec = Recorder::new();
    let session = Arc::new(
        recorder_kernel(&rec)
            .build()
            .open_session(SessionConfig::new("s")),
    );
    let mut events = session.subscribe();
    let s = session.clone();
    let run = tokio::spawn(async move {
        s.run_round(
            round(vec![
                call(0, "write", json!({"tag": "first", "delay_ms": 300})),
                call(1, "write", json!({"tag": "second"})),
                call(2, "read", json!({"tag": "third"})),
            ]),
            &RoundOptions::default(),
        )
        .await
    });
    // Cancel once the first call has started.
    loop {
        if let ring0_kernel::Event::CallStarted { index: 0, .. } = events.recv().await.unwrap() {
            break;
        }
    }
    session.cancel();
    let out = run.await.unwrap();
    assert_eq!(
        out.receipts[0].state,
        Some(IntentState::Acked),
        "the running call settles"
    );
    assert_eq!(status(&out.receipts[1]), Some(RejectionKind::Cancelled));
    assert_eq!(status(&out.receipts[2]), Some(RejectionKind::Cancelled));
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn a_retried_write_with_a_fresh_call_id_replays_instead_of_running_again() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let session = kernel.open_session(SessionConfig::new("user:42"));
    let first = session
        .run_round(
            round(vec![call(0, "write", tag("refund-20"))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(first.receipts[0].disposition, Disposition::Dispatched);
    // A second session of the same user scope, as after a crash, with a new call id.
    let again = kernel.open_session(SessionConfig::new("user:42"));
    let mut c = call(0, "write", tag("refund-20"));
    c.call_id = "call_fresh".into();
    let second = again
        .run_round(round(vec![c]), &RoundOptions::default())
        .await;
    assert_eq!(rec.calls(), 1, "one effect");
    assert_eq!(second.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(second.receipts[0].call_id, "call_fresh");
    assert_eq!(second.receipts[0].intent_id, first.receipts[0].intent_id);
}

#[tokio::test]
async fn a_new_attempt_epoch_or_scope_is_a_new_intent() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    for cfg in [
        SessionConfig::new("user:42"),
        SessionConfig::new("user:42").attempt_epoch(1),
        SessionConfig::new("user:43"),
    ] {
        kernel
            .open_session(cfg)
            .run_round(
                round(vec![call(0, "write", tag("t"))]),
                &RoundOptions::default(),
            )
            .await;
    }
    assert_eq!(rec.calls(), 3);
}

#[tokio::test]
async fn reads_run_every_time_they_are_asked() {
    let rec = Recorder::new();
    let session = recorder_kernel(&rec)
        .build()
        .open_session(SessionConfig::new("s"));
    for _ in 0..2 {
        let out = session
            .run_round(
                round(vec![call(0, "read", tag("r"))]),
                &RoundOptions::default(),
            )
            .await;
        assert_eq!(out.receipts[0].disposition, Disposition::Dispatched);
    }
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn a_write_already_in_flight_is_waited_for_and_answers_the_identical_call() {
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).build();
    let a = kernel.open_session(SessionConfig::new("u"));
    let b = kernel.open_session(SessionConfig::new("u"));
    let mut events = a.subscribe();
    let first = tokio::spawn(async move {
        a.run_round(
            round(vec![call(0, "write", json!({"tag": "w", "delay_ms": 300}))]),
            &RoundOptions::default(),
        )
        .await
    });
    loop {
        if let ring0_kernel::Event::CallStarted { .. } = events.recv().await.unwrap() {
            break;
        }
    }
    let second = b
        .run_round(
            round(vec![call(0, "write", json!({"tag": "w", "delay_ms": 300}))]),
            &RoundOptions::default(),
        )
        .await;
    // The identical call waited for the one in flight and got its result: one effect.
    assert_eq!(second.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(second.receipts[0].state, Some(IntentState::Acked));
    let first = first.await.unwrap();
    assert_eq!(first.receipts[0].state, Some(IntentState::Acked));
    assert_eq!(first.receipts[0].intent_id, second.receipts[0].intent_id);
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn the_journal_holds_the_timeline_and_the_receipt() {
    let rec = Recorder::new();
    let journal = Arc::new(MemoryJournal::new());
    let kernel = recorder_kernel(&rec).journal(journal.clone()).build();
    let out = kernel
        .open_session(SessionConfig::new("s"))
        .run_round(
            round(vec![call(0, "write", tag("w"))]),
            &RoundOptions::default(),
        )
        .await;
    let receipt = &out.receipts[0];
    let id = receipt.intent_id.as_ref().unwrap().parse().unwrap();
    let record = journal.get(id).await.unwrap().unwrap();
    let states: Vec<IntentState> = record.timeline.iter().map(|t| t.state).collect();
    assert_eq!(
        states,
        vec![
            IntentState::Proposed,
            IntentState::Recorded,
            IntentState::Dispatched,
            IntentState::Acked
        ]
    );
    assert_eq!(record.receipt.as_ref().unwrap().outcome, receipt.outcome);
    assert_eq!(receipt.revision, record.fence);
    assert_eq!(
        receipt.idempotency_key.as_deref(),
        Some(record.idempotency_key.as_str())
    );
}

/// An external service that applies effects, deduplicates by idempotency key, and loses the
/// first acknowledgement.
#[derive(Default)]
struct Flaky {
    effects: Mutex<Vec<String>>,
    keys: Mutex<Vec<String>>,
    attempts: AtomicUsize,
    honour_keys: bool,
    probe_answer: Mutex<Option<ProbeFinding>>,
    apply_before_loss: bool,
}

struct FlakyTool(Arc<Flaky>);

#[async_trait]
impl Tool for FlakyTool {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let f = &self.0;
        let n = f.attempts.fetch_add(1, Ordering::SeqCst);
        let key = ctx.idempotency_key.clone().unwrap();
        let seen = f.keys.lock().unwrap().contains(&key);
        if !(f.honour_keys && seen) && (n > 0 || f.apply_before_loss) {
            f.effects
                .lock()
                .unwrap()
                .push(args["tag"].as_str().unwrap().to_string());
        }
        f.keys.lock().unwrap().push(key);
        if n == 0 {
            Err(ToolError::unknown("ack lost"))
        } else {
            Ok(Observation::text("done"))
        }
    }

    async fn snapshot(&self, _args: &Value) -> Option<Value> {
        Some(json!({"effects": self.0.effects.lock().unwrap().len()}))
    }

    async fn probe(&self, _args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        if let Some(v) = self.0.probe_answer.lock().unwrap().clone() {
            return v;
        }
        let before = snapshot.and_then(|s| s["effects"].as_u64()).unwrap_or(0) as usize;
        if self.0.effects.lock().unwrap().len() > before {
            ProbeFinding::Applied(Box::new(Observation::text("found the effect")))
        } else {
            ProbeFinding::Unchanged
        }
    }
}

fn flaky_kernel(f: &Arc<Flaky>, settlement: Settlement) -> Kernel {
    let spec = ToolSpec::new("pay", "", recorder_schema())
        .effect(Effect::NonIdempotent)
        .authority(Authority::A2)
        .strategy(&[Strategy::Exploitation])
        .settlement(settlement);
    Kernel::builder()
        .tool(spec, Arc::new(FlakyTool(f.clone())))
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A2)))
        .build()
}

async fn pay(kernel: &Kernel) -> ring0_core::Receipt {
    kernel
        .open_session(SessionConfig::new("u"))
        .run_round(
            round(vec![call(0, "pay", tag("p"))]),
            &RoundOptions::default(),
        )
        .await
        .receipts
        .remove(0)
}

#[tokio::test]
async fn idempotency_key_settlement_redispatches_with_the_same_key() {
    let f = Arc::new(Flaky {
        honour_keys: true,
        apply_before_loss: true,
        ..Flaky::default()
    });
    let r = pay(&flaky_kernel(&f, Settlement::IdempotencyKey)).await;
    assert_eq!(r.state, Some(IntentState::Acked));
    assert_eq!(r.disposition, Disposition::Recovered);
    let keys = f.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(
        f.effects.lock().unwrap().len(),
        1,
        "the provider deduplicated the retry"
    );
    let states: Vec<IntentState> = r.timeline.iter().map(|t| t.state).collect();
    assert!(
        states
            .windows(2)
            .any(|w| w == [IntentState::Unknown, IntentState::Reconciling])
    );
}

#[tokio::test]
async fn a_probe_that_finds_the_effect_acks_without_running_again() {
    let f = Arc::new(Flaky {
        apply_before_loss: true,
        ..Flaky::default()
    });
    let r = pay(&flaky_kernel(&f, Settlement::Probe)).await;
    assert_eq!(r.state, Some(IntentState::Acked));
    assert_eq!(r.disposition, Disposition::Recovered);
    assert_eq!(f.attempts.load(Ordering::SeqCst), 1);
    assert_eq!(f.effects.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_probe_that_finds_nothing_changed_makes_a_redispatch_safe() {
    let f = Arc::new(Flaky::default());
    let r = pay(&flaky_kernel(&f, Settlement::Probe)).await;
    assert_eq!(r.state, Some(IntentState::Acked));
    assert_eq!(f.attempts.load(Ordering::SeqCst), 2);
    assert_eq!(f.effects.lock().unwrap().len(), 1);
    let states: Vec<IntentState> = r.timeline.iter().map(|t| t.state).collect();
    assert!(
        states
            .windows(2)
            .any(|w| w == [IntentState::Reconciling, IntentState::Recorded])
    );
}

#[tokio::test]
async fn an_indeterminate_probe_or_no_settlement_goes_to_a_person() {
    let f = Arc::new(Flaky {
        apply_before_loss: true,
        ..Flaky::default()
    });
    *f.probe_answer.lock().unwrap() = Some(ProbeFinding::Indeterminate("partial".into()));
    assert_eq!(
        pay(&flaky_kernel(&f, Settlement::Probe)).await.state,
        Some(IntentState::DeadLetter)
    );
    let g = Arc::new(Flaky {
        apply_before_loss: true,
        ..Flaky::default()
    });
    let r = pay(&flaky_kernel(&g, Settlement::None)).await;
    assert_eq!(r.state, Some(IntentState::DeadLetter));
    assert_eq!(
        g.attempts.load(Ordering::SeqCst),
        1,
        "never retried blindly"
    );
}

#[tokio::test]
async fn a_dead_lettered_intent_is_not_run_again_by_a_retry() {
    let f = Arc::new(Flaky {
        apply_before_loss: true,
        ..Flaky::default()
    });
    let kernel = flaky_kernel(&f, Settlement::None);
    assert_eq!(pay(&kernel).await.state, Some(IntentState::DeadLetter));
    let again = pay(&kernel).await;
    // The journal refuses the dead-lettered call itself until a person settles it.
    assert_eq!(status(&again), Some(RejectionKind::IntentConflict));
    assert_eq!(f.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn observations_over_budget_are_cut_and_say_so() {
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read("cat", "", json!({"type": "object"})).observation_budget_bytes(1000),
            ring0_kernel::tool_fn(|_c, _a| async { Ok(Observation::text("é".repeat(5000))) }),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    let out = kernel
        .open_session(SessionConfig::new("s"))
        .run_round(
            round(vec![call(0, "cat", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    let CallOutcome::Completed { observation } = &out.receipts[0].outcome else {
        panic!()
    };
    assert!(observation.text.len() <= 1000);
    assert!(observation.text.contains("of 10000 bytes"));
}

#[tokio::test]
async fn journal_failure_fails_closed() {
    struct Broken;
    #[async_trait]
    impl Journal for Broken {
        async fn propose(
            &self,
            _p: ring0_journal::Proposal,
        ) -> Result<ring0_journal::ProposeDecision, ring0_journal::JournalError> {
            Err(ring0_journal::JournalError::Storage("disk full".into()))
        }
        async fn transition(
            &self,
            t: ring0_journal::Transition,
        ) -> Result<ring0_journal::IntentRecord, ring0_journal::JournalError> {
            Err(ring0_journal::JournalError::NotFound(t.id))
        }
        async fn get(
            &self,
            _id: ring0_journal::IntentId,
        ) -> Result<Option<ring0_journal::IntentRecord>, ring0_journal::JournalError> {
            Ok(None)
        }
        async fn find_by_key(
            &self,
            _k: &ring0_core::SemanticKey,
        ) -> Result<Option<ring0_journal::IntentRecord>, ring0_journal::JournalError> {
            Ok(None)
        }
        async fn open_records(
            &self,
        ) -> Result<Vec<ring0_journal::IntentRecord>, ring0_journal::JournalError> {
            Ok(vec![])
        }
        async fn recent(
            &self,
            _n: usize,
        ) -> Result<Vec<ring0_journal::IntentRecord>, ring0_journal::JournalError> {
            Ok(vec![])
        }
    }
    let rec = Recorder::new();
    let kernel = recorder_kernel(&rec).journal(Arc::new(Broken)).build();
    let out = kernel
        .open_session(SessionConfig::new("s"))
        .run_round(
            round(vec![call(0, "write", tag("w"))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(
        status(&out.receipts[0]),
        Some(RejectionKind::JournalUnavailable)
    );
    assert_eq!(rec.calls(), 0);
}

#[tokio::test]
async fn reads_bypass_the_journal_unless_the_session_audits_them() {
    let rec = Recorder::new();
    let journal = Arc::new(MemoryJournal::new());
    let kernel = recorder_kernel(&rec).journal(journal.clone()).build();
    let plain = kernel.open_session(SessionConfig::new("s"));
    let out = plain
        .run_round(
            round(vec![call(0, "read", tag("r"))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    assert!(out.receipts[0].intent_id.is_none());
    assert!(journal.recent(10).await.unwrap().is_empty());
    let audited = kernel.open_session(SessionConfig::new("s").journal_reads(true));
    let out = audited
        .run_round(
            round(vec![call(0, "read", tag("r"))]),
            &RoundOptions::default(),
        )
        .await;
    let id = out.receipts[0]
        .intent_id
        .as_ref()
        .expect("journaled")
        .parse()
        .unwrap();
    let record = journal.get(id).await.unwrap().unwrap();
    assert!(!record.mutating);
    assert_eq!(record.state, IntentState::Acked);
}

#[tokio::test]
async fn a_tool_can_report_a_background_job_after_its_call_returned() {
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read("start_job", "", json!({"type": "object"})),
            ring0_kernel::tool_fn(|ctx, _args| async move {
                let events = ctx.events.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    events.job_update("job_1", "COMPLETED", json!({"exit_code": 0}));
                });
                Ok(Observation::json(
                    json!({"job": "job_1", "state": "RUNNING"}),
                ))
            }),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let mut events = session.subscribe();
    let out = session
        .run_round(
            round(vec![call(0, "start_job", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    let update = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            if let ring0_kernel::Event::JobUpdate { job, state, .. } = events.recv().await.unwrap()
            {
                return (job, state);
            }
        }
    })
    .await
    .expect("the completion arrived as an event");
    assert_eq!(update, ("job_1".to_string(), "COMPLETED".to_string()));
}

#[tokio::test]
async fn a_deterministic_read_is_served_byte_identical_from_the_journal_within_its_ttl() {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read(
                "lookup",
                "",
                json!({"type": "object", "properties": {"k": {"type": "string"}}}),
            )
            .deterministic(true),
            ring0_kernel::tool_fn(move |_ctx, args| {
                let r = r.clone();
                async move {
                    let n = r.fetch_add(1, Ordering::SeqCst);
                    Ok(Observation::json(json!({"k": args["k"], "run": n})))
                }
            }),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .journal(Arc::new(MemoryJournal::new()))
        .build();
    let memo = kernel.open_session(SessionConfig::new("s").memo_ttl_ms(60_000));
    let ask = |k: &str| round(vec![call(0, "lookup", json!({"k": k}))]);
    let first = memo.run_round(ask("a"), &RoundOptions::default()).await;
    let second = memo.run_round(ask("a"), &RoundOptions::default()).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(second.receipts[0].disposition, Disposition::Memoized);
    assert_eq!(first.receipts[0].outcome, second.receipts[0].outcome);
    memo.run_round(ask("b"), &RoundOptions::default()).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "other arguments run the tool"
    );
    let plain = kernel.open_session(SessionConfig::new("s"));
    plain.run_round(ask("a"), &RoundOptions::default()).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "without a TTL the tool always runs"
    );
}

#[tokio::test]
async fn a_definite_failure_of_a_same_key_retry_does_not_clear_the_first_attempt() {
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let spec = ToolSpec::new("pay", "", recorder_schema())
        .effect(Effect::NonIdempotent)
        .authority(Authority::A2)
        .strategy(&[Strategy::Exploitation])
        .settlement(Settlement::IdempotencyKey);
    let kernel = Kernel::builder()
        .tool(
            spec,
            ring0_kernel::tool_fn(move |_ctx, _args| {
                let a = a.clone();
                async move {
                    if a.fetch_add(1, Ordering::SeqCst) == 0 {
                        Err(ToolError::unknown("connection lost after send"))
                    } else {
                        Err(ToolError::not_applied("connection refused"))
                    }
                }
            }),
        )
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A2)))
        .build();
    let r = kernel
        .open_session(SessionConfig::new("u"))
        .run_round(
            round(vec![call(0, "pay", tag("p"))]),
            &RoundOptions::default(),
        )
        .await
        .receipts
        .remove(0);
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    // Not FAILED: the first attempt may have been applied. A person decides.
    assert_eq!(r.state, Some(IntentState::DeadLetter));
}

/// A fact of the host's about one call (where it came from).
struct Origin(&'static str);

/// Allows a call only when the host said where it came from.
struct NeedsOrigin;

#[async_trait]
impl ring0_kernel::Authorizer for NeedsOrigin {
    async fn authorize(
        &self,
        request: &ring0_kernel::AuthRequest<'_>,
    ) -> ring0_kernel::AuthDecision {
        match request.extensions.get::<Origin>() {
            Some(_) => ring0_kernel::AuthDecision::Allow {
                rule: "origin".into(),
            },
            None => ring0_kernel::AuthDecision::Deny {
                rule: "origin".into(),
                reason: "the call came from nowhere".into(),
            },
        }
    }

    fn visible(&self, _session: &ring0_kernel::SessionInfo, _spec: &ToolSpec) -> bool {
        true
    }
}

#[tokio::test]
async fn the_hosts_per_call_context_reaches_the_authorizer_and_the_tool() {
    let whoami = ring0_kernel::tool_fn(|ctx: CallContext, _args: Value| async move {
        let origin = ctx.extensions.get::<Origin>().map_or("none", |o| o.0);
        Ok(Observation::text(origin))
    });
    let kernel = Kernel::builder()
        .tool(
            ToolSpec::read("whoami", "who called", json!({"type": "object"})),
            whoami,
        )
        .unwrap()
        .authorizer(Arc::new(NeedsOrigin))
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let from_client = RoundOptions {
        extensions: ring0_kernel::CallExtensions::new().with(Origin("client-7")),
        ..RoundOptions::default()
    };
    let out = session
        .run_round(round(vec![call(0, "whoami", json!({}))]), &from_client)
        .await;
    let CallOutcome::Completed { observation } = &out.receipts[0].outcome else {
        panic!("{:?}", out.receipts[0].outcome)
    };
    assert_eq!(observation.text, "client-7");

    let out = session
        .run_round(
            round(vec![call(0, "whoami", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    let CallOutcome::Rejected { rejection } = &out.receipts[0].outcome else {
        panic!("{:?}", out.receipts[0].outcome)
    };
    assert_eq!(rejection.status, RejectionKind::PolicyDenied);
}
