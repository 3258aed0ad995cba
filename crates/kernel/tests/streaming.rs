//! Streamed rounds: calls assembled as their blocks complete, detached calls started early
//! through the ordinary dispatcher, and the round ledger across provider retries. Transcripts are
//! replayed in each provider's streaming format.

use async_trait::async_trait;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::CallOutcome;
use ring0_core::{
    Authority, Effect, ExecutionProfile, IntentState, Observation, ProviderFormat, Strategy,
    StrategySet, ToolSpec,
};
use ring0_kernel::traits::{ConnectionTraits, LOCAL_CONNECTION, TraitOverride};
use ring0_kernel::{
    CallContext, GrantTable, Kernel, KernelBuilder, RoundIdentity, RoundOptions, SessionConfig,
    StreamNotice, Tool, ToolError,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Counts runs and announces each start.
#[derive(Default)]
struct Counted {
    runs: AtomicUsize,
    started: Notify,
}

struct CountedTool(Arc<Counted>);

#[async_trait]
impl Tool for CountedTool {
    async fn call(&self, _ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        self.0.runs.fetch_add(1, Ordering::SeqCst);
        self.0.started.notify_waiters();
        Ok(Observation::json(json!({"done": args})))
    }
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"task": {"type": "string"}, "path": {"type": "string"},
        "text": {"type": "string"}, "q": {"type": "string"}}})
}

struct Tools {
    delegate: Arc<Counted>,
    write: Arc<Counted>,
    search: Arc<Counted>,
    mystery: Arc<Counted>,
}

fn builder(t: &Tools) -> KernelBuilder {
    let delegate = ToolSpec::new(
        "delegate",
        "Hand a self-contained task to a helper",
        schema(),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A1)
    .strategy(&[Strategy::Neutral])
    .execution(ExecutionProfile::EARLY);
    let write = ToolSpec::new("write_file", "Write a file", schema())
        .effect(Effect::Idempotent)
        .authority(Authority::A1)
        .strategy(&[Strategy::Exploitation]);
    let search = ToolSpec::read("search", "Search", schema());
    let mystery = ToolSpec::new("mystery", "No declared strategy", schema())
        .authority(Authority::A1)
        .execution(ExecutionProfile::EARLY);
    Kernel::builder()
        .tool(delegate, Arc::new(CountedTool(t.delegate.clone())))
        .unwrap()
        .tool(write, Arc::new(CountedTool(t.write.clone())))
        .unwrap()
        .tool(search, Arc::new(CountedTool(t.search.clone())))
        .unwrap()
        .tool(mystery, Arc::new(CountedTool(t.mystery.clone())))
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
}

fn tools() -> Tools {
    Tools {
        delegate: Arc::default(),
        write: Arc::default(),
        search: Arc::default(),
        mystery: Arc::default(),
    }
}

// --- Anthropic Messages stream events ---------------------------------------------------------

fn a_start(index: u64, id: &str, name: &str) -> Value {
    json!({"type": "content_block_start", "index": index,
           "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})
}
fn a_delta(index: u64, part: &str) -> Value {
    json!({"type": "content_block_delta", "index": index,
           "delta": {"type": "input_json_delta", "partial_json": part}})
}
fn a_stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}
fn a_message_stop() -> Value {
    json!({"type": "message_stop"})
}

/// `{"path":"report.md","text":"<n words>"}` cut into many small fragments, like a long write.
fn long_write_fragments(words: usize) -> Vec<String> {
    let body = format!(
        "{{\"path\":\"report.md\",\"text\":\"{}\"}}",
        (0..words)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    body.as_bytes()
        .chunks(7)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect()
}

async fn started_within(c: &Counted, runs: usize) -> bool {
    let wait = async {
        while c.runs.load(Ordering::SeqCst) < runs {
            let n = c.started.notified();
            if c.runs.load(Ordering::SeqCst) >= runs {
                break;
            }
            n.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), wait)
        .await
        .is_ok()
}

#[tokio::test]
async fn a_detached_call_starts_before_the_long_write_finishes_streaming() {
    let t = tools();
    let kernel = builder(&t).build();
    let session = kernel.open_session(SessionConfig::new("u"));
    let mut round = session.streaming_round(
        ProviderFormat::Anthropic,
        RoundIdentity::new("turn-1", 0),
        RoundOptions::default(),
    );
    round
        .push(&json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant"}}))
        .await
        .unwrap();
    round
        .push(&a_start(0, "toolu_d", "delegate"))
        .await
        .unwrap();
    round
        .push(&a_delta(0, "{\"task\":\"summarize "))
        .await
        .unwrap();
    round.push(&a_delta(0, "the logs\"}")).await.unwrap();
    let notices = round.push(&a_stop(0)).await.unwrap();
    assert_eq!(
        notices,
        vec![StreamNotice::EarlyStarted {
            index: 0,
            call_id: "toolu_d".into(),
            tool: "delegate".into()
        }]
    );
    round
        .push(&a_start(1, "toolu_w", "write_file"))
        .await
        .unwrap();
    let fragments = long_write_fragments(400);
    let half = fragments.len() / 2;
    for f in &fragments[..half] {
        assert!(round.push(&a_delta(1, f)).await.unwrap().is_empty());
    }
    // The write is still streaming, and the delegate already ran.
    assert!(
        started_within(&t.delegate, 1).await,
        "delegate started during generation"
    );
    assert_eq!(t.write.runs.load(Ordering::SeqCst), 0);
    for f in &fragments[half..] {
        round.push(&a_delta(1, f)).await.unwrap();
    }
    let notices = round.push(&a_stop(1)).await.unwrap();
    assert!(matches!(
        &notices[0],
        StreamNotice::Completed { index: 1, .. }
    ));
    round.push(&a_message_stop()).await.unwrap();
    let out = round.finish().await;
    assert_eq!(out.receipts.len(), 2);
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    assert_eq!(out.receipts[1].state, Some(IntentState::Acked));
    assert_eq!(
        t.delegate.runs.load(Ordering::SeqCst),
        1,
        "consumed once, not run again at the end"
    );
    assert_eq!(t.write.runs.load(Ordering::SeqCst), 1);
    assert_eq!(out.results[0].call_id, "toolu_d");
}

#[tokio::test]
async fn a_rejected_later_sibling_leaves_the_early_call_valid() {
    let t = tools();
    let session = builder(&t).build().open_session(SessionConfig::new("u"));
    let mut round = session.streaming_round(
        ProviderFormat::Anthropic,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    for e in [
        a_start(0, "d", "delegate"),
        a_delta(0, "{\"task\":\"x\"}"),
        a_stop(0),
    ] {
        round.push(&e).await.unwrap();
    }
    for e in [
        a_start(1, "w", "write_file"),
        a_delta(1, "{\"path\": 7}"),
        a_stop(1),
        a_message_stop(),
    ] {
        round.push(&e).await.unwrap();
    }
    let out = round.finish().await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    match &out.receipts[1].outcome {
        CallOutcome::Rejected { rejection } => {
            assert_eq!(rejection.status, RejectionKind::ValidationError)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.delegate.runs.load(Ordering::SeqCst), 1);
}

// --- OpenAI Chat Completions chunks --------------------------------------------------------------

fn c_call(i: u64, id: &str, name: &str, args: &str) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": args}}
    ]}, "finish_reason": null}]})
}
fn c_args(i: u64, args: &str) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": i, "function": {"arguments": args}}
    ]}, "finish_reason": null}]})
}
fn c_finish() -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
}

#[tokio::test]
async fn a_provider_retry_with_reordered_siblings_does_not_start_the_call_again() {
    let t = tools();
    let session = builder(&t).build().open_session(SessionConfig::new("u"));
    let id = RoundIdentity::new("turn-7", 2);
    let mut first = session.streaming_round(
        ProviderFormat::OpenAiChat,
        id.clone(),
        RoundOptions::default(),
    );
    first
        .push(&c_call(0, "call_d", "delegate", "{\"task\":"))
        .await
        .unwrap();
    first.push(&c_args(0, "\"index the repo\"}")).await.unwrap();
    let n = first
        .push(&c_call(1, "call_s", "search", "{\"q\":\"todo\"}"))
        .await
        .unwrap();
    assert!(matches!(&n[0], StreamNotice::EarlyStarted { index: 0, .. }));
    // The provider fails and the decision is retried: the re-emitted round puts the search first,
    // gives the delegate a fresh call id and drops nothing else.
    let _aborted = first.abort("provider retry").await;
    assert!(started_within(&t.delegate, 1).await);
    let mut retry =
        session.streaming_round(ProviderFormat::OpenAiChat, id, RoundOptions::default());
    retry
        .push(&c_call(0, "call_s2", "search", "{\"q\":\"todo\"}"))
        .await
        .unwrap();
    let n = retry
        .push(&c_call(
            1,
            "call_d2",
            "delegate",
            "{\"task\":\"index the repo\"}",
        ))
        .await
        .unwrap();
    assert!(matches!(&n[0], StreamNotice::Completed { index: 0, .. }));
    let n = retry.push(&c_finish()).await.unwrap();
    assert_eq!(
        n,
        vec![StreamNotice::AlreadyConsumed {
            index: 1,
            call_id: "call_d2".into(),
            tool: "delegate".into()
        }]
    );
    let out = retry.finish().await;
    assert_eq!(
        t.delegate.runs.load(Ordering::SeqCst),
        1,
        "at most once per round"
    );
    assert_eq!(out.receipts[1].state, Some(IntentState::Acked));
    assert_eq!(out.results[1].call_id, "call_d2");
}

#[tokio::test]
async fn a_stream_that_aborts_mid_arguments_dispatches_nothing_partial() {
    let t = tools();
    let session = builder(&t).build().open_session(SessionConfig::new("u"));
    let mut round = session.streaming_round(
        ProviderFormat::OpenAiChat,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    round
        .push(&c_call(
            0,
            "call_w",
            "write_file",
            "{\"path\":\"a.txt\",\"te",
        ))
        .await
        .unwrap();
    let out = round.finish().await; // no finish_reason: the stream broke
    match &out.receipts[0].outcome {
        CallOutcome::Rejected { rejection } => {
            assert_eq!(rejection.status, RejectionKind::StreamAborted)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.write.runs.load(Ordering::SeqCst), 0);
    assert_eq!(out.results[0].call_id, "call_w");
}

// --- OpenAI Responses events ---------------------------------------------------------------------

fn r_added(item: &str, call: &str, name: &str) -> Value {
    json!({"type": "response.output_item.added", "output_index": 0,
           "item": {"type": "function_call", "id": item, "call_id": call, "name": name, "arguments": "", "status": "in_progress"}})
}
fn r_delta(item: &str, d: &str) -> Value {
    json!({"type": "response.function_call_arguments.delta", "item_id": item, "output_index": 0, "delta": d})
}
fn r_done(item: &str, args: &str) -> Value {
    json!({"type": "response.function_call_arguments.done", "item_id": item, "output_index": 0, "arguments": args})
}

#[tokio::test]
async fn exploration_then_exploitation_in_one_streamed_round_refuses_the_write() {
    let t = tools();
    let session = builder(&t).build().open_session(SessionConfig::new("u"));
    let mut round = session.streaming_round(
        ProviderFormat::OpenAiResponses,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    for e in [
        r_added("fc_1", "call_s", "search"),
        r_delta("fc_1", "{\"q\":"),
        r_delta("fc_1", "\"prices\"}"),
        r_done("fc_1", "{\"q\":\"prices\"}"),
        r_added("fc_2", "call_w", "write_file"),
        r_delta("fc_2", "{\"path\":\"p.md\",\"text\":\"from the search\"}"),
        r_done("fc_2", "{\"path\":\"p.md\",\"text\":\"from the search\"}"),
        json!({"type": "response.output_item.done", "output_index": 1, "item": {"type": "function_call", "id": "fc_2", "call_id": "call_w", "name": "write_file", "arguments": "{\"path\":\"p.md\",\"text\":\"from the search\"}"}}),
        json!({"type": "response.completed", "response": {"id": "resp_1"}}),
    ] {
        round.push(&e).await.unwrap();
    }
    let out = round.finish().await;
    assert_eq!(
        out.receipts.len(),
        2,
        "output_item.done did not emit the call twice"
    );
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    match &out.receipts[1].outcome {
        CallOutcome::Rejected { rejection } => {
            assert_eq!(rejection.status, RejectionKind::StrategyConflict)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.write.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_unknown_strategy_call_runs_alone_and_never_early() {
    let t = tools();
    let session = builder(&t).build().open_session(SessionConfig::new("u"));
    let mut round = session.streaming_round(
        ProviderFormat::Anthropic,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    let mut notices = Vec::new();
    for e in [
        a_start(0, "m", "mystery"),
        a_delta(0, "{}"),
        a_stop(0),
        a_start(1, "d", "delegate"),
        a_delta(1, "{\"task\":\"x\"}"),
        a_stop(1),
        a_message_stop(),
    ] {
        notices.extend(round.push(&e).await.unwrap());
    }
    assert!(
        notices
            .iter()
            .all(|n| !matches!(n, StreamNotice::EarlyStarted { .. })),
        "{notices:?}"
    );
    let out = round.finish().await;
    assert_eq!(out.receipts[0].state, Some(IntentState::Acked));
    match &out.receipts[1].outcome {
        CallOutcome::Rejected { rejection } => {
            assert_eq!(rejection.status, RejectionKind::RunsAlone)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(t.delegate.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn configuration_overrides_traits_declared_in_code() {
    let t = tools();
    // Code says the search explores; the deployment makes it a detached neutral call, and takes
    // the early profile away from the delegate by name.
    let mut config = ConnectionTraits::new();
    config.insert(
        "*".into(),
        TraitOverride {
            strategy: Some(StrategySet::NEUTRAL),
            execution: Some(ExecutionProfile::EARLY),
        },
    );
    config.insert(
        "delegate".into(),
        TraitOverride {
            strategy: None,
            execution: Some(ExecutionProfile::default()),
        },
    );
    let kernel = builder(&t)
        .connection_traits(LOCAL_CONNECTION, config)
        .build();
    let session = kernel.open_session(SessionConfig::new("u"));
    let catalog: Vec<String> = session
        .catalog()
        .iter()
        .map(|s| ring0_kernel::traits::render_catalog_entry(s))
        .collect();
    let search = catalog.iter().find(|c| c.starts_with("search:")).unwrap();
    assert!(
        search.contains(
            "Scope:\n    - strategy: neutral\n    - execution: trigger=tool_call_complete"
        ),
        "{search}"
    );
    let delegate = catalog.iter().find(|c| c.starts_with("delegate:")).unwrap();
    assert!(!delegate.contains("execution:"), "{delegate}");

    let mut round = session.streaming_round(
        ProviderFormat::Anthropic,
        RoundIdentity::new("t", 0),
        RoundOptions::default(),
    );
    let mut notices = Vec::new();
    for e in [
        a_start(0, "s", "search"),
        a_delta(0, "{\"q\":\"a\"}"),
        a_stop(0),
        a_start(1, "d", "delegate"),
        a_delta(1, "{\"task\":\"b\"}"),
        a_stop(1),
        a_message_stop(),
    ] {
        notices.extend(round.push(&e).await.unwrap());
    }
    assert!(matches!(&notices[0], StreamNotice::EarlyStarted { tool, .. } if tool == "search"));
    assert!(matches!(&notices[1], StreamNotice::Completed { tool, .. } if tool == "delegate"));
    let out = round.finish().await;
    assert!(
        out.receipts
            .iter()
            .all(|r| r.state == Some(IntentState::Acked))
    );
}
