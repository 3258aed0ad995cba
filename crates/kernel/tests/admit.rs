//! Admission: tool choice, the round overseer and the exact-repeat guard.

mod common;

use common::*;
use ring0_core::call::RejectionKind;
use ring0_core::receipt::CallOutcome;
use ring0_core::{Authority, Observation, Strategy, ToolSpec};
use ring0_kernel::events::RepeatAction;
use ring0_kernel::{
    Event, GrantTable, Kernel, RepeatLimits, RoundOptions, SessionConfig, Termination, ToolChoice,
    tool_fn,
};
use serde_json::json;
use std::sync::Arc;

fn status(r: &ring0_core::Receipt) -> Option<RejectionKind> {
    match &r.outcome {
        CallOutcome::Rejected { rejection } => Some(rejection.status),
        _ => None,
    }
}

fn strategy_kernel(rec: &Arc<Recorder>) -> Kernel {
    let t = || Arc::new(RecorderTool(rec.clone())) as Arc<dyn ring0_kernel::Tool>;
    let spec = |name: &str, s: &[Strategy]| {
        ToolSpec::new(name, "", recorder_schema())
            .authority(Authority::A1)
            .strategy(s)
    };
    Kernel::builder()
        .tool(spec("search", &[Strategy::Exploration]), t())
        .unwrap()
        .tool(spec("write_report", &[Strategy::Exploitation]), t())
        .unwrap()
        .tool(spec("schedule", &[Strategy::Neutral]), t())
        .unwrap()
        .tool(spec("mystery", &[]), t())
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A1)))
        .build()
}

#[tokio::test]
async fn exploration_then_exploitation_in_one_round_refuses_the_write() {
    let rec = Recorder::new();
    let session = strategy_kernel(&rec).open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![
                call(0, "search", json!({"tag": "s"})),
                call(1, "write_report", json!({"tag": "w"})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(status(&out.receipts[0]), None);
    assert_eq!(
        status(&out.receipts[1]),
        Some(RejectionKind::StrategyConflict)
    );
    let content = out.results[1].content.to_string();
    assert!(content.contains("next round"), "{content}");
    assert_eq!(rec.calls(), 1);
}

#[tokio::test]
async fn exploitation_then_exploration_is_allowed() {
    let rec = Recorder::new();
    let session = strategy_kernel(&rec).open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![
                call(0, "write_report", json!({"tag": "w"})),
                call(1, "search", json!({"tag": "s"})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert!(out.receipts.iter().all(|r| status(r).is_none()));
    assert_eq!(rec.calls(), 2);
}

#[tokio::test]
async fn unknown_strategy_runs_alone() {
    let rec = Recorder::new();
    let session = strategy_kernel(&rec).open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![
                call(0, "schedule", json!({"tag": "n"})),
                call(1, "mystery", json!({"tag": "m"})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(status(&out.receipts[1]), Some(RejectionKind::RunsAlone));
    let out = session
        .run_round(
            round(vec![
                call(0, "mystery", json!({"tag": "m"})),
                call(1, "search", json!({"tag": "s"})),
            ]),
            &RoundOptions::default(),
        )
        .await;
    assert_eq!(status(&out.receipts[0]), None);
    assert_eq!(status(&out.receipts[1]), Some(RejectionKind::RunsAlone));
}

fn ping_kernel() -> Kernel {
    let ping = ToolSpec::read(
        "ping",
        "",
        json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
    );
    let poll = ToolSpec::read("poll", "", json!({"type": "object"})).track_exact_repeats(false);
    let ok = || tool_fn(|_c, _a| async { Ok(Observation::text("pong")) });
    Kernel::builder()
        .tool(ping, ok())
        .unwrap()
        .tool(poll, ok())
        .unwrap()
        .authorizer(Arc::new(GrantTable::allow(&["*"], Authority::A0)))
        .build()
}

async fn ping(session: &ring0_kernel::Session, n: i64) -> ring0_kernel::RoundOutcome {
    session
        .run_round(
            round(vec![call(0, "ping", json!({"n": n}))]),
            &RoundOptions::default(),
        )
        .await
}

#[tokio::test]
async fn third_identical_call_gets_an_advisory_and_one_policy_message() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    let mut events = session.subscribe();
    assert!(ping(&session, 1).await.policy_message.is_none());
    assert!(ping(&session, 1).await.policy_message.is_none());
    let third = ping(&session, 1).await;
    let msg = third.policy_message.expect("advisory message");
    assert!(msg.contains("\"ping\"") && msg.len() <= ring0_kernel::admit::POLICY_MESSAGE_BYTES_MAX);
    assert!(!msg.contains("\"n\""), "the message never echoes arguments");
    assert_eq!(
        status(&third.receipts[0]),
        None,
        "an advisory still runs the call"
    );
    assert!(
        ping(&session, 1).await.policy_message.is_none(),
        "one message, not one per call"
    );
    let mut advisories = 0;
    while let Ok(e) = events.try_recv() {
        if let Event::RepeatDetected {
            action: RepeatAction::Advisory,
            count,
            ..
        } = e
        {
            assert_eq!(count, 3);
            advisories += 1;
        }
    }
    assert_eq!(advisories, 1);
}

#[tokio::test]
async fn eighth_identical_call_is_not_dispatched_and_ends_the_run() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    for _ in 0..7 {
        assert!(ping(&session, 1).await.terminated.is_none());
    }
    let eighth = ping(&session, 1).await;
    assert_eq!(
        status(&eighth.receipts[0]),
        Some(RejectionKind::RepeatLimit)
    );
    assert_eq!(
        eighth.terminated,
        Some(Termination::RepeatLimit {
            tool: "ping".into(),
            count: 8
        })
    );
    // That fingerprint stays refused while the sequence goes on, until a genuine user message.
    assert_eq!(
        status(&ping(&session, 1).await.receipts[0]),
        Some(RejectionKind::RepeatLimit)
    );
    session.user_message().await;
    assert_eq!(status(&ping(&session, 1).await.receipts[0]), None);
}

#[tokio::test]
async fn repeat_termination_refuses_that_fingerprint_not_other_calls() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    for _ in 0..8 {
        ping(&session, 1).await;
    }
    // A different call runs, and breaks the sequence: the first call runs again too.
    assert_eq!(status(&ping(&session, 2).await.receipts[0]), None);
    assert_eq!(status(&ping(&session, 1).await.receipts[0]), None);
}

#[tokio::test]
async fn sessions_of_one_scope_share_the_repeat_guard() {
    let kernel = ping_kernel();
    for _ in 0..7 {
        // A fresh session per call, as a host does for overlapping calls.
        ping(&kernel.open_session(SessionConfig::new("s")), 1).await;
    }
    let eighth = ping(&kernel.open_session(SessionConfig::new("s")), 1).await;
    assert_eq!(
        status(&eighth.receipts[0]),
        Some(RejectionKind::RepeatLimit)
    );
    // Another scope counts on its own.
    let other = ping(&kernel.open_session(SessionConfig::new("t")), 1).await;
    assert_eq!(status(&other.receipts[0]), None);
}

#[tokio::test]
async fn the_advisory_reaches_the_model_with_the_result_of_the_third_call() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    for n in 1..=3 {
        let out = ping(&session, 1).await;
        let notice = out.results[0].content.get("notice");
        if n < 3 {
            assert!(notice.is_none());
        } else {
            let text = notice.and_then(|v| v.as_str()).unwrap();
            assert!(text.contains("3 times in a row"), "{text}");
        }
    }
}

#[tokio::test]
async fn a_different_call_or_a_user_message_resets_the_sequence() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    ping(&session, 1).await;
    ping(&session, 1).await;
    ping(&session, 2).await;
    assert!(ping(&session, 1).await.policy_message.is_none());
    ping(&session, 1).await;
    session.user_message().await;
    assert!(ping(&session, 1).await.policy_message.is_none());
}

#[tokio::test]
async fn repeats_count_within_one_round_too() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    let calls = (0..8).map(|i| call(i, "ping", json!({"n": 5}))).collect();
    let out = session
        .run_round(round(calls), &RoundOptions::default())
        .await;
    assert!(out.policy_message.is_some());
    assert_eq!(status(&out.receipts[7]), Some(RejectionKind::RepeatLimit));
    assert!(out.receipts[..7].iter().all(|r| status(r).is_none()));
}

#[tokio::test]
async fn zero_thresholds_disable_the_guard() {
    let session = ping_kernel().open_session(SessionConfig::new("s").repeat_limits(RepeatLimits {
        advisory: 0,
        terminate: 0,
    }));
    for _ in 0..12 {
        let out = ping(&session, 1).await;
        assert!(out.policy_message.is_none() && out.terminated.is_none());
    }
}

#[tokio::test]
async fn exempt_tools_neither_advance_nor_reset_the_sequence() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    for _ in 0..20 {
        let out = session
            .run_round(
                round(vec![call(0, "poll", json!({}))]),
                &RoundOptions::default(),
            )
            .await;
        assert!(out.terminated.is_none());
    }
    ping(&session, 1).await;
    ping(&session, 1).await;
    session
        .run_round(
            round(vec![call(0, "poll", json!({}))]),
            &RoundOptions::default(),
        )
        .await;
    assert!(
        ping(&session, 1).await.policy_message.is_some(),
        "poll did not reset the count"
    );
}

#[tokio::test]
async fn tool_choice_is_enforced_on_what_comes_back() {
    let session = ping_kernel().open_session(SessionConfig::new("s"));
    let out = session
        .run_round(
            round(vec![call(0, "ping", json!({"n": 1}))]),
            &RoundOptions::tool_choice(ToolChoice::None),
        )
        .await;
    assert_eq!(
        status(&out.receipts[0]),
        Some(RejectionKind::ToolChoiceViolation)
    );
    let out = session
        .run_round(
            round(vec![
                call(0, "ping", json!({"n": 1})),
                call(1, "poll", json!({})),
            ]),
            &RoundOptions::tool_choice(ToolChoice::Named("poll".into())),
        )
        .await;
    assert_eq!(
        status(&out.receipts[0]),
        Some(RejectionKind::ToolChoiceViolation)
    );
    assert_eq!(status(&out.receipts[1]), None);
    assert!(!out.missing_required_call);
    let out = session
        .run_round(
            round(vec![]),
            &RoundOptions::tool_choice(ToolChoice::Required),
        )
        .await;
    assert!(out.missing_required_call);
    let out = session
        .run_round(round(vec![]), &RoundOptions::tool_choice(ToolChoice::Auto))
        .await;
    assert!(!out.missing_required_call);
}
