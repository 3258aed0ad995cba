//! Limits that depend on each other hold together: whatever a tool declares or returns and
//! whatever a model sends, the model-visible result fits the projection bound, and a run ends
//! with `projection_failed` only when a host projector fails.

use ring0_core::limits::{
    OBSERVATION_BYTES_MAX, PROJECTION_BYTES_MAX, RECEIPT_ENVELOPE_BYTES_MAX,
    REJECTION_LIST_ITEMS_MAX,
};
use ring0_core::{
    Authority, Effect, Observation, ProposedArguments, ProposedCall, Round, ToolSpec,
};
use ring0_kernel::{
    GrantTable, Kernel, ProjectionInput, Projector, RegistrationError, RoundOptions, RoundOutcome,
    Session, SessionConfig, tool_fn,
};
use serde_json::{Map, Value, json};
use std::sync::Arc;

fn allow_all() -> Arc<GrantTable> {
    Arc::new(GrantTable::allow(&["*"], Authority::A1))
}

fn one_call(tool: &str, args: Value) -> Round {
    Round {
        calls: vec![ProposedCall {
            index: 0,
            call_id: "c0".into(),
            tool: tool.into(),
            arguments: ProposedArguments::Value(args),
            idempotency_key: None,
        }],
        text: None,
    }
}

async fn run(session: &Session, tool: &str, args: Value) -> RoundOutcome {
    session
        .run_round(one_call(tool, args), &RoundOptions::default())
        .await
}

fn projected_bytes(out: &RoundOutcome) -> usize {
    serde_json::to_vec(&out.results[0].content).unwrap().len()
}

#[test]
fn a_budget_that_cannot_fit_the_projection_is_refused_with_the_numbers() {
    let spec =
        ToolSpec::read("big_read", "", json!({"type": "object"})).observation_budget_bytes(100_000);
    let Err(refused) =
        Kernel::builder().tool(spec, tool_fn(|_c, _a| async { Ok(Observation::text("")) }))
    else {
        panic!("a 100,000-byte budget was accepted")
    };
    assert_eq!(
        refused.error,
        RegistrationError::ObservationBudget {
            tool: "big_read".into(),
            budget_bytes: 100_000
        }
    );
    let message = refused.to_string();
    for number in [
        "100000".to_string(),
        PROJECTION_BYTES_MAX.to_string(),
        RECEIPT_ENVELOPE_BYTES_MAX.to_string(),
        OBSERVATION_BYTES_MAX.to_string(),
    ] {
        assert!(
            message.contains(&number),
            "{number} missing from: {message}"
        );
    }
}

#[tokio::test]
async fn an_80_kb_result_of_a_read_at_the_largest_budget_is_shaped_to_fit_and_the_run_goes_on() {
    let spec = ToolSpec::read("big_read", "", json!({"type": "object"}))
        .observation_budget_bytes(OBSERVATION_BYTES_MAX);
    let kernel = Kernel::builder()
        .tool(
            spec,
            tool_fn(|_c, _a| async { Ok(Observation::text("\"quoted!\" ".repeat(8 * 1024))) }),
        )
        .unwrap()
        .authorizer(allow_all())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let out = run(&session, "big_read", json!({})).await;
    assert!(out.terminated.is_none(), "{:?}", out.terminated);
    assert_ne!(out.results[0].content["status"], "projection_failed");
    assert!(projected_bytes(&out) <= PROJECTION_BYTES_MAX);
    let text = out.results[0].content["outcome"]["observation"]["text"]
        .as_str()
        .unwrap();
    let at = text.find("cut here").unwrap_or(0);
    assert!(
        text.contains("of 81920 bytes cut here"),
        "{}",
        &text[at.saturating_sub(80)..(at + 80).min(text.len())]
    );
    // The session goes on.
    let again = run(&session, "big_read", json!({})).await;
    assert!(again.terminated.is_none());
}

fn wide_tool(params: usize, enum_values: usize) -> ToolSpec {
    let mut props = Map::new();
    for i in 0..params {
        props.insert(
            format!("parameter_number_{i:03}"),
            json!({"type": "string"}),
        );
    }
    let values: Vec<String> = (0..enum_values).map(|i| format!("value-{i:05}")).collect();
    props.insert("mode".into(), json!({"type": "string", "enum": values}));
    ToolSpec::read(
        "wide",
        "a tool with many parameters",
        json!({"type": "object", "properties": props, "required": ["mode"]}),
    )
}

#[tokio::test]
async fn forty_unknown_keys_on_a_300_parameter_tool_give_a_bounded_rejection_and_the_session_goes_on()
 {
    let kernel = Kernel::builder()
        .tool(
            wide_tool(300, 2000),
            tool_fn(|_c, _a| async { Ok(Observation::text("ran")) }),
        )
        .unwrap()
        .authorizer(allow_all())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let mut args = Map::new();
    for i in 0..40 {
        args.insert(
            format!("unknown_key_{i:02}_{}", "k".repeat(300)),
            json!("x".repeat(500)),
        );
    }
    args.insert("mode".into(), json!("not-a-mode"));
    let out = run(&session, "wide", Value::Object(args)).await;
    let content = &out.results[0].content;
    assert_eq!(content["status"], "validation_error");
    assert!(projected_bytes(&out) <= PROJECTION_BYTES_MAX);
    assert!(out.terminated.is_none());
    let errors = content["errors"].as_array().unwrap();
    let listed = errors.len() as u64 + content["errors_omitted"].as_u64().unwrap_or(0);
    assert_eq!(
        listed, 41,
        "40 unknown keys and one enum miss, listed or counted"
    );
    for e in errors {
        let domain = &e["expected_domain"];
        if let Some(allowed) = domain.get("allowed_properties") {
            assert_eq!(allowed.as_array().unwrap().len(), REJECTION_LIST_ITEMS_MAX);
            assert_eq!(
                domain["allowed_properties_more"],
                301 - REJECTION_LIST_ITEMS_MAX as u64
            );
        }
        if let Some(values) = domain.get("enum") {
            assert_eq!(values.as_array().unwrap().len(), REJECTION_LIST_ITEMS_MAX);
            assert_eq!(domain["enum_more"], 2000 - REJECTION_LIST_ITEMS_MAX as u64);
            assert!(!values.as_array().unwrap().contains(&json!("not-a-mode")));
        }
    }
    // A later call of the same session is not refused.
    let ok = run(&session, "wide", json!({"mode": "value-00001"})).await;
    assert_eq!(
        ok.results[0].content["outcome"]["observation"]["text"],
        "ran"
    );
}

#[tokio::test]
async fn the_allowed_properties_listed_for_an_unknown_key_are_the_closest_first() {
    let kernel = Kernel::builder()
        .tool(
            wide_tool(300, 1),
            tool_fn(|_c, _a| async { Ok(Observation::text("ran")) }),
        )
        .unwrap()
        .authorizer(allow_all())
        .build();
    let session = kernel.open_session(SessionConfig::new("s"));
    let out = run(
        &session,
        "wide",
        json!({"mode": "value-00000", "parameter_nunber_217": "x"}),
    )
    .await;
    let allowed = &out.results[0].content["errors"][0]["expected_domain"]["allowed_properties"];
    assert_eq!(allowed[0], "parameter_number_217");
}

struct Failing;
impl Projector for Failing {
    fn project(&self, _input: &ProjectionInput<'_>) -> Result<Value, String> {
        Err("the host's template broke".into())
    }
}

fn failing_projection_session() -> Session {
    let write = ToolSpec::new("write", "", json!({"type": "object"}))
        .effect(Effect::NonIdempotent)
        .authority(Authority::A1);
    Kernel::builder()
        .tool(
            ToolSpec::read("read", "", json!({"type": "object"})),
            tool_fn(|_c, _a| async { Ok(Observation::text("r")) }),
        )
        .unwrap()
        .tool(
            write,
            tool_fn(|_c, _a| async { Err(ring0_kernel::ToolError::unknown("reset after send")) }),
        )
        .unwrap()
        .authorizer(allow_all())
        .build()
        .open_session(SessionConfig::new("s").projector(Arc::new(Failing)))
}

#[tokio::test]
async fn projection_failed_after_a_completed_call_says_it_ran() {
    let out = run(&failing_projection_session(), "read", json!({})).await;
    let content = &out.results[0].content;
    assert_eq!(content["status"], "projection_failed");
    let message = content["message"].as_str().unwrap();
    assert!(message.contains("ran and completed"), "{message}");
    assert!(!message.contains("may already have been applied"));
}

#[tokio::test]
async fn projection_failed_after_an_ambiguous_write_says_it_may_have_been_applied() {
    let out = run(&failing_projection_session(), "write", json!({})).await;
    let message = out.results[0].content["message"].as_str().unwrap();
    assert!(
        message.contains("may already have been applied"),
        "{message}"
    );
}
