//! Property tests of planning and dispatch with a recording tool and random delays: never two
//! equal conflict keys at once, never more than `max_concurrent_tools`, results always in source
//! order, barriers never overlap anything, nothing starts after cancellation.

mod common;

use common::*;
use proptest::prelude::*;
use ring0_core::{Authority, ConcurrencyMark, Effect, Observation, Strategy as Trait, ToolSpec};
use ring0_kernel::{
    CallContext, Event, GrantTable, Kernel, RoundOptions, SchedulingMode, Session, SessionConfig,
    Tool, ToolError,
};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, OnceLock};

/// Cases per property; the suite's floor is 1,000.
const CASES: u32 = 1_000;

#[derive(Debug, Clone)]
struct CallPlan {
    read: bool,
    mark: ConcurrencyMark,
    key: Option<u8>,
    delay_ms: u64,
}

fn tool_name(c: &CallPlan) -> String {
    let kind = if c.read { "r" } else { "w" };
    let mark = match c.mark {
        ConcurrencyMark::Default => "d",
        ConcurrencyMark::Parallel => "p",
        ConcurrencyMark::Sequential => "s",
    };
    let keyed = if c.key.is_some() { "k" } else { "u" };
    format!("{kind}{mark}{keyed}")
}

/// The oracle: does this call run alone under this mode?
fn is_barrier(mode: SchedulingMode, c: &CallPlan) -> bool {
    match (mode, c.mark) {
        (SchedulingMode::Sequential, _) | (_, ConcurrencyMark::Sequential) => true,
        (_, ConcurrencyMark::Parallel) | (SchedulingMode::Parallel, _) => false,
        (SchedulingMode::SafeParallel, ConcurrencyMark::Default) => !c.read,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Entry {
    Start(usize),
    End(usize),
}

struct Probe {
    log: Mutex<Vec<Entry>>,
    cancel_at: Option<usize>,
    session: OnceLock<Arc<Session>>,
}

struct ProbeTool(Arc<Probe>);

#[async_trait::async_trait]
impl Tool for ProbeTool {
    async fn call(&self, _ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        let i = args["i"].as_u64().unwrap() as usize;
        self.0.log.lock().unwrap().push(Entry::Start(i));
        if self.0.cancel_at == Some(i) {
            self.0.session.get().unwrap().cancel();
        }
        let delay = args["delay_ms"].as_u64().unwrap();
        if delay > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        } else {
            tokio::task::yield_now().await;
        }
        self.0.log.lock().unwrap().push(Entry::End(i));
        Ok(Observation::json(json!({"i": i})))
    }
}

fn kernel(probe: &Arc<Probe>) -> Kernel {
    let schema = json!({"type": "object", "properties": {
        "i": {"type": "integer"}, "delay_ms": {"type": "integer"}, "key": {"type": "string"}
    }, "required": ["i", "delay_ms"]});
    let mut b = Kernel::builder();
    for read in [true, false] {
        for mark in [
            ConcurrencyMark::Default,
            ConcurrencyMark::Parallel,
            ConcurrencyMark::Sequential,
        ] {
            for keyed in [true, false] {
                let c = CallPlan {
                    read,
                    mark,
                    key: keyed.then_some(0),
                    delay_ms: 0,
                };
                let mut spec = ToolSpec::new(tool_name(&c), "", schema.clone())
                    .authority(Authority::A1)
                    .concurrency(mark)
                    // Neutral: the strategy overseer accepts every call, so only epochs decide.
                    .strategy(&[Trait::Neutral])
                    .effect(if read {
                        Effect::Nullipotent
                    } else {
                        Effect::Idempotent
                    })
                    .track_exact_repeats(false);
                if keyed {
                    spec = spec.conflict_key("k:{key}");
                }
                b = b.tool(spec, Arc::new(ProbeTool(probe.clone()))).unwrap();
            }
        }
    }
    b.authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
        .build()
}

fn call_plan() -> impl Strategy<Value = CallPlan> {
    (
        any::<bool>(),
        prop_oneof![
            3 => Just(ConcurrencyMark::Default),
            1 => Just(ConcurrencyMark::Parallel),
            1 => Just(ConcurrencyMark::Sequential)
        ],
        prop::option::of(0u8..3),
        0u64..3,
    )
        .prop_map(|(read, mark, key, delay_ms)| CallPlan {
            read,
            mark,
            key,
            delay_ms,
        })
}

fn mode() -> impl Strategy<Value = SchedulingMode> {
    prop_oneof![
        Just(SchedulingMode::Sequential),
        Just(SchedulingMode::SafeParallel),
        Just(SchedulingMode::Parallel)
    ]
}

struct Run {
    log: Vec<Entry>,
    events: Vec<Event>,
    result_ids: Vec<String>,
}

fn run(calls: &[CallPlan], mode: SchedulingMode, max: usize, cancel_at: Option<usize>) -> Run {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let probe = Arc::new(Probe {
            log: Mutex::new(Vec::new()),
            cancel_at,
            session: OnceLock::new(),
        });
        let session = Arc::new(
            kernel(&probe)
                .open_session(SessionConfig::new("p").mode(mode).max_concurrent_tools(max)),
        );
        probe.session.set(session.clone()).ok();
        let mut rx = session.subscribe();
        let proposed = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut args = json!({"i": i, "delay_ms": c.delay_ms});
                if let Some(k) = c.key {
                    args["key"] = json!(format!("K{k}"));
                }
                call(i, &tool_name(c), args)
            })
            .collect();
        let out = session
            .run_round(round(proposed), &RoundOptions::default())
            .await;
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        Run {
            log: probe.log.lock().unwrap().clone(),
            events,
            result_ids: out.results.iter().map(|r| r.call_id.clone()).collect(),
        }
    })
}

fn check(
    calls: &[CallPlan],
    mode: SchedulingMode,
    max: usize,
    r: &Run,
) -> Result<(), TestCaseError> {
    let expected: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    prop_assert_eq!(&r.result_ids, &expected, "results in source order");
    let mut running: Vec<usize> = Vec::new();
    for e in &r.log {
        match *e {
            Entry::Start(i) => {
                prop_assert!(
                    running.len() < max,
                    "more than {} running: {:?} + {}",
                    max,
                    running,
                    i
                );
                if let Some(k) = calls[i].key.filter(|_| true) {
                    let clash = running.iter().any(|&j| calls[j].key == Some(k));
                    prop_assert!(!clash, "two calls with key K{} at once", k);
                }
                if is_barrier(mode, &calls[i]) {
                    prop_assert!(
                        running.is_empty(),
                        "barrier {} started beside {:?}",
                        i,
                        running
                    );
                }
                prop_assert!(
                    !running.iter().any(|&j| is_barrier(mode, &calls[j])),
                    "{} started while a barrier ran",
                    i
                );
                running.push(i);
            }
            Entry::End(i) => running.retain(|&j| j != i),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn epochs_respect_keys_bounds_barriers_and_source_order(
        calls in prop::collection::vec(call_plan(), 1..9),
        mode in mode(),
        max in 1usize..4,
    ) {
        let r = run(&calls, mode, max, None);
        check(&calls, mode, max, &r)?;
        let starts = r.log.iter().filter(|e| matches!(e, Entry::Start(_))).count();
        prop_assert_eq!(starts, calls.len(), "every call ran exactly once");
    }

    #[test]
    fn nothing_starts_after_cancellation(
        calls in prop::collection::vec(call_plan(), 1..9),
        mode in mode(),
        max in 1usize..4,
        at in 0usize..8,
    ) {
        let at = at % calls.len();
        let r = run(&calls, mode, max, Some(at));
        check(&calls, mode, max, &r)?;
        let cancel_pos = r.events.iter().position(|e| matches!(e, Event::Cancelled));
        prop_assert!(cancel_pos.is_some(), "the cancelling call ran");
        let late = r.events[cancel_pos.unwrap()..]
            .iter()
            .filter(|e| matches!(e, Event::CallStarted { .. }))
            .count();
        prop_assert_eq!(late, 0, "a call started after cancellation");
    }
}
