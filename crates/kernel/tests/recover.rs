//! Recovery at start: what a crashed process left open is settled from the log alone.

mod common;

use async_trait::async_trait;
use common::*;
use ring0_core::receipt::Disposition;
use ring0_core::{
    Authority, Effect, IntentState, Observation, SemanticKey, Settlement, Strategy, ToolSpec,
};
use ring0_journal::{Journal, MemoryJournal, Proposal, ProposeDecision, Transition};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, ProbeFinding, RoundOptions, SessionConfig, Tool, ToolError,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A counter service: each call adds one; the probe compares with the snapshot.
#[derive(Default)]
struct Counter {
    effects: AtomicUsize,
    calls: AtomicUsize,
}

struct CounterTool(Arc<Counter>);

#[async_trait]
impl Tool for CounterTool {
    async fn call(&self, _ctx: CallContext, _args: Value) -> Result<Observation, ToolError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        let n = self.0.effects.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Observation::json(json!({"count": n})))
    }
    async fn snapshot(&self, _args: &Value) -> Option<Value> {
        Some(json!(self.0.effects.load(Ordering::SeqCst)))
    }
    async fn probe(&self, _args: &Value, snapshot: Option<&Value>) -> ProbeFinding {
        let before = snapshot.and_then(Value::as_u64).unwrap_or(0) as usize;
        if self.0.effects.load(Ordering::SeqCst) > before {
            ProbeFinding::Applied(Box::new(Observation::text("the increment is there")))
        } else {
            ProbeFinding::Unchanged
        }
    }
}

fn kernel(counter: &Arc<Counter>, journal: Arc<MemoryJournal>, settlement: Settlement) -> Kernel {
    let spec = ToolSpec::new(
        "increment",
        "",
        json!({"type": "object", "properties": {"by": {"type": "integer"}}}),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A2)
    .strategy(&[Strategy::Exploitation])
    .settlement(settlement);
    Kernel::builder()
        .tool(spec, Arc::new(CounterTool(counter.clone())))
        .unwrap()
        .journal(journal)
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A2)))
        .build()
}

/// The journal as the next process opens it: same log, a new incarnation.
fn reopen(journal: &MemoryJournal) -> Arc<MemoryJournal> {
    Arc::new(MemoryJournal::from_records(
        journal.records(),
        Arc::new(ring0_journal::SystemClock),
    ))
}

/// What a process that died mid-call leaves behind: the intent recorded, and DISPATCHED when
/// `dispatched`, with the pre-dispatch snapshot.
async fn leftover(
    journal: &MemoryJournal,
    counter: &Counter,
    dispatched: bool,
) -> ring0_journal::IntentRecord {
    let args = json!({"by": 1});
    let canonical = ring0_core::canonical::canonical_string(&args).unwrap();
    let key = SemanticKey::from_canonical_args("increment", &canonical, "user:1", 0).unwrap();
    let ProposeDecision::Recorded(r) = journal
        .propose(Proposal {
            intent_id: None,
            semantic_key: key,
            scope: "user:1".into(),
            attempt_epoch: 0,
            tool: "increment".into(),
            canonical_args: canonical,
            call_id: "call_before_crash".into(),
            mutating: true,
            client_key: None,
            principal: None,
        })
        .await
        .unwrap()
    else {
        panic!("fresh intent")
    };
    if !dispatched {
        return r;
    }
    let snapshot = Some(json!(counter.effects.load(Ordering::SeqCst)));
    journal
        .transition(Transition::to(&r, IntentState::Dispatched).snapshot(snapshot))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_call_in_flight_at_a_crash_is_settled_by_its_probe_not_sent_again() {
    let counter = Arc::new(Counter::default());
    let journal = Arc::new(MemoryJournal::new());
    let r = leftover(&journal, &counter, true).await;
    counter.effects.fetch_add(1, Ordering::SeqCst); // the effect landed; the ack was lost
    let journal = reopen(&journal);
    let k = kernel(&counter, journal.clone(), Settlement::Probe);
    let report = k.recover().await.unwrap();
    assert_eq!(report.in_flight, 1);
    assert_eq!(
        journal.get(r.id).await.unwrap().unwrap().state,
        IntentState::Acked
    );
    assert_eq!(counter.calls.load(Ordering::SeqCst), 0, "never re-sent");
    // The model retries with a fresh call id: the stored receipt is replayed.
    let mut c = call(0, "increment", json!({"by": 1}));
    c.call_id = "call_after_restart".into();
    let out = k
        .open_session(SessionConfig::new("user:1"))
        .run_round(round(vec![c]), &RoundOptions::default())
        .await;
    assert_eq!(out.receipts[0].disposition, Disposition::Replayed);
    assert_eq!(counter.effects.load(Ordering::SeqCst), 1, "one effect");
}

#[tokio::test]
async fn a_call_in_flight_without_settlement_waits_for_a_person() {
    let counter = Arc::new(Counter::default());
    let journal = Arc::new(MemoryJournal::new());
    let r = leftover(&journal, &counter, true).await;
    let journal = reopen(&journal);
    let k = kernel(&counter, journal.clone(), Settlement::None);
    k.recover().await.unwrap();
    assert_eq!(
        journal.get(r.id).await.unwrap().unwrap().state,
        IntentState::DeadLetter
    );
    assert_eq!(counter.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_committed_call_never_sent_is_dispatched_once_from_the_log() {
    let counter = Arc::new(Counter::default());
    let journal = Arc::new(MemoryJournal::new());
    let r = leftover(&journal, &counter, false).await;
    let journal = reopen(&journal);
    let k = kernel(&counter, journal.clone(), Settlement::Probe);
    let report = k.recover().await.unwrap();
    assert_eq!(report.resumed, 1);
    assert_eq!(
        journal.get(r.id).await.unwrap().unwrap().state,
        IntentState::Acked
    );
    assert_eq!(counter.effects.load(Ordering::SeqCst), 1);
    assert_eq!(
        k.recover().await.unwrap().examined,
        0,
        "nothing is left open"
    );
}

#[tokio::test]
async fn recovery_leaves_the_intents_of_a_tool_this_process_lacks_open_for_one_that_has_it() {
    let counter = Arc::new(Counter::default());
    let journal = Arc::new(MemoryJournal::new());
    let r = leftover(&journal, &counter, true).await;
    // A process without the tool (a command without the upstream that serves it).
    let journal = reopen(&journal);
    let other = ToolSpec::new("noop", "", json!({"type": "object"}))
        .effect(Effect::Nullipotent)
        .authority(Authority::A0);
    let without = Kernel::builder()
        .tool(other, Arc::new(CounterTool(Arc::new(Counter::default()))))
        .unwrap()
        .journal(journal.clone())
        .build();
    let report = without.recover().await.unwrap();
    assert_eq!(report.deferred.len(), 1);
    assert_eq!(report.in_flight, 0);
    let left = journal.get(r.id).await.unwrap().unwrap();
    assert_eq!(
        left.state,
        IntentState::Dispatched,
        "untouched, not dead-lettered"
    );
    assert_eq!(left.fence, r.fence);
    // The process that has the tool settles it by probe, without sending it again.
    counter.effects.fetch_add(1, Ordering::SeqCst);
    let journal = reopen(&journal);
    let with = kernel(&counter, journal.clone(), Settlement::Probe);
    let report = with.recover().await.unwrap();
    assert_eq!(report.in_flight, 1);
    assert_eq!(
        journal.get(r.id).await.unwrap().unwrap().state,
        IntentState::Acked
    );
    assert_eq!(counter.calls.load(Ordering::SeqCst), 0, "never re-sent");
}
