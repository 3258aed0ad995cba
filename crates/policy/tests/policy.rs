//! Authorization through the kernel: grants, authority levels, CEL rules, discovery, approvals,
//! rate limits and the audit trail, each observed as the model and the operator would see it.

use async_trait::async_trait;
use ring0_core::{Authority, Effect, Observation, ProviderFormat, Settlement, Strategy, ToolSpec};
use ring0_kernel::{Kernel, RoundOptions, SessionConfig, Tool, tool_fn};
use ring0_policy::{
    ApprovalOutcome, ApprovalRequest, Approver, AuditDecision, Decision, DirectoryApprover, Grant,
    MemoryAudit, Policy, RateLimit, decide_pending, list_pending,
};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn counting_tool(counter: Arc<AtomicUsize>) -> Arc<dyn Tool> {
    tool_fn(move |_ctx, args| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(Observation::json(json!({"ran_with": args})))
        }
    })
}

fn read_spec() -> ToolSpec {
    ToolSpec::read(
        "read_file",
        "read",
        json!({"type": "object", "properties": {"path": {"type": "string"}, "max_bytes": {"type": "integer"}}, "required": ["path"]}),
    )
}

fn pay_spec() -> ToolSpec {
    ToolSpec::new(
        "pay",
        "send money",
        json!({"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}}, "required": ["to", "amount"]}),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A3)
    .strategy(&[Strategy::Exploitation])
    .settlement(Settlement::IdempotencyKey)
}

fn deploy_spec(settlement: Settlement) -> ToolSpec {
    ToolSpec::new(
        "deploy",
        "deploy",
        json!({"type": "object", "properties": {"env": {"type": "string"}}}),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A2)
    .strategy(&[Strategy::Exploitation])
    .settlement(settlement)
}

fn sandboxed_write_spec() -> ToolSpec {
    ToolSpec::new(
        "write_file",
        "write",
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    )
    .effect(Effect::Idempotent)
    .authority(Authority::A1)
    .strategy(&[Strategy::Exploitation])
    .settlement(Settlement::Probe)
}

struct Harness {
    session: ring0_kernel::Session,
    runs: Arc<AtomicUsize>,
    audit: Arc<MemoryAudit>,
}

fn harness(specs: Vec<ToolSpec>, policy: ring0_policy::PolicyBuilder) -> Harness {
    let runs = Arc::new(AtomicUsize::new(0));
    let audit = Arc::new(MemoryAudit::new());
    let mut builder = Kernel::builder();
    for spec in specs {
        builder = builder.tool(spec, counting_tool(runs.clone())).unwrap();
    }
    let policy = policy.audit(audit.clone()).build();
    let kernel = builder.build();
    let session = kernel.open_session(SessionConfig::new("user:1").authorizer(Arc::new(policy)));
    Harness {
        session,
        runs,
        audit,
    }
}

/// Calls one tool through an Anthropic turn and returns the model-visible result.
async fn call(h: &Harness, tool: &str, input: Value) -> Value {
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": tool, "input": input}
    ]});
    let out = h
        .session
        .handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default())
        .await
        .unwrap();
    let block = &out.message["content"][0];
    let content = &block["content"];
    let text = content
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| content[0]["text"].as_str().unwrap_or_default().to_string());
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

fn status(result: &Value) -> &str {
    result["status"].as_str().unwrap_or("ran")
}

#[tokio::test]
async fn cel_rule_allows_matching_arguments() {
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("args.path.startsWith('src/')")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    let r = call(&h, "read_file", json!({"path": "src/lib.rs"})).await;
    assert_eq!(status(&r), "ran", "{r}");
    assert_eq!(h.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cel_rule_denies_other_arguments_naming_the_rule() {
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("args.path.startsWith('src/')")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    let r = call(&h, "read_file", json!({"path": ".env"})).await;
    assert_eq!(status(&r), "policy_denied");
    assert!(
        r["message"].as_str().unwrap().contains("rule:files[0]"),
        "{r}"
    );
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn rule_that_errors_denies() {
    // A string compared with a number has no overload: an evaluation error.
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("args.path < 3")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    let r = call(&h, "read_file", json!({"path": "src/a"})).await;
    assert_eq!(status(&r), "policy_denied");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("could not be evaluated"),
        "{r}"
    );
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn absent_argument_never_skips_its_rule() {
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("args.max_bytes <= 1024")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    // `max_bytes` is optional in the schema and absent here: the rule cannot hold, so it denies.
    let r = call(&h, "read_file", json!({"path": "src/a"})).await;
    assert_eq!(status(&r), "policy_denied", "{r}");
    assert!(r["message"].as_str().unwrap().contains("max_bytes"), "{r}");
    let r = call(&h, "read_file", json!({"path": "src/a", "max_bytes": 10})).await;
    assert_eq!(status(&r), "ran", "{r}");
}

#[tokio::test]
async fn has_guard_lets_a_rule_accept_absence_explicitly() {
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("!has(args.max_bytes) || args.max_bytes <= 1024")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    assert_eq!(
        status(&call(&h, "read_file", json!({"path": "a"})).await),
        "ran"
    );
    let r = call(&h, "read_file", json!({"path": "a", "max_bytes": 5000})).await;
    assert_eq!(status(&r), "policy_denied");
}

#[tokio::test]
async fn numeric_rule_bounds_an_amount() {
    let grant = Grant::new("pay", &["pay"], Authority::A3)
        .rule("args.amount <= 100")
        .unwrap();
    let approver = Arc::new(ScriptedApprover::approving());
    let h = harness(
        vec![pay_spec()],
        Policy::builder()
            .grant(grant)
            .unwrap()
            .approver(approver.clone()),
    );
    let r = call(&h, "pay", json!({"to": "bob", "amount": 500})).await;
    assert_eq!(status(&r), "policy_denied");
    assert_eq!(
        approver.asked(),
        0,
        "a call the rules deny is never put to a person"
    );
}

#[tokio::test]
async fn discovery_lists_only_tools_the_session_may_call() {
    let policy = Policy::builder()
        .grant(Grant::new("read", &["read_*"], Authority::A0))
        .unwrap()
        .grant(Grant::new("deploy", &["deploy"], Authority::A1))
        .unwrap();
    let h = harness(
        vec![
            read_spec(),
            deploy_spec(Settlement::IdempotencyKey),
            pay_spec(),
        ],
        policy,
    );
    let names: Vec<&str> = h
        .session
        .catalog()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        names,
        vec!["read_file"],
        "deploy is above its ceiling, pay is named by no grant"
    );
    let r = call(&h, "pay", json!({"to": "x", "amount": 1})).await;
    assert_eq!(
        status(&r),
        "unknown_tool",
        "an unlisted tool is unknown to the model: {r}"
    );
}

#[tokio::test]
async fn first_grant_naming_a_tool_decides() {
    let policy = Policy::builder()
        .grant(
            Grant::new("narrow", &["read_file"], Authority::A0)
                .rule("args.path == 'ok'")
                .unwrap(),
        )
        .unwrap()
        .grant(Grant::new("broad", &["*"], Authority::A0))
        .unwrap();
    let h = harness(vec![read_spec()], policy);
    assert_eq!(
        status(&call(&h, "read_file", json!({"path": "other"})).await),
        "policy_denied"
    );
}

fn authorize_directly(policy: &Policy, spec: &ToolSpec, args: Value) -> ring0_kernel::AuthDecision {
    use ring0_kernel::{AuthRequest, Authorizer, SessionInfo};
    let session = SessionInfo {
        scope: "user:1".into(),
        session_id: "s1".into(),
        principal: ring0_core::Principal::local(),
    };
    let request = AuthRequest {
        session: &session,
        spec,
        call_id: "c1",
        args: &args,
        args_hash: "v1:test",
        events: None,
        extensions: &Default::default(),
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(policy.authorize(&request))
}

fn denied_rule(decision: ring0_kernel::AuthDecision) -> String {
    match decision {
        ring0_kernel::AuthDecision::Deny { rule, reason } => format!("{rule}: {reason}"),
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[test]
fn a1_tool_outside_the_sandbox_is_judged_as_a2_and_hidden() {
    let grant = Grant::new("w", &["write_file"], Authority::A1);
    let policy = Policy::builder().grant(grant.clone()).unwrap().build();
    let why = denied_rule(authorize_directly(
        &policy,
        &sandboxed_write_spec(),
        json!({"path": "a"}),
    ));
    assert!(
        why.starts_with("ceiling:w") && why.contains("judged as A2"),
        "{why}"
    );
    let h = harness(
        vec![sandboxed_write_spec()],
        Policy::builder().grant(grant.clone()).unwrap(),
    );
    assert!(h.session.catalog().is_empty());

    let h = harness(
        vec![sandboxed_write_spec()],
        Policy::builder()
            .grant(grant)
            .unwrap()
            .sandboxed_tools(["write_file"]),
    );
    assert_eq!(h.session.catalog().len(), 1);
}

#[tokio::test]
async fn sandboxed_a1_tool_runs_within_an_a1_grant() {
    let h = harness(
        vec![sandboxed_write_spec()],
        Policy::builder()
            .grant(Grant::new("w", &["write_file"], Authority::A1))
            .unwrap()
            .sandboxed_tools(["write_file"]),
    );
    assert_eq!(
        status(&call(&h, "write_file", json!({"path": "a"})).await),
        "ran"
    );
}

#[test]
fn a2_tool_without_settlement_is_denied_and_hidden() {
    let policy = Policy::builder()
        .grant(Grant::new("d", &["deploy"], Authority::A2))
        .unwrap()
        .build();
    let why = denied_rule(authorize_directly(
        &policy,
        &deploy_spec(Settlement::None),
        json!({}),
    ));
    assert!(why.starts_with("a2_settlement:d"), "{why}");
    let h = harness(
        vec![deploy_spec(Settlement::None)],
        Policy::builder()
            .grant(Grant::new("d", &["deploy"], Authority::A2))
            .unwrap(),
    );
    assert!(h.session.catalog().is_empty());
}

#[tokio::test]
async fn a2_tool_with_settlement_or_held_for_approval_runs() {
    let h = harness(
        vec![deploy_spec(Settlement::IdempotencyKey)],
        Policy::builder()
            .grant(Grant::new("d", &["deploy"], Authority::A2))
            .unwrap(),
    );
    assert_eq!(
        status(&call(&h, "deploy", json!({"env": "prod"})).await),
        "ran"
    );

    let h = harness(
        vec![deploy_spec(Settlement::None)],
        Policy::builder()
            .grant(Grant::new("d", &["deploy"], Authority::A2).approval(true))
            .unwrap()
            .approver(Arc::new(ScriptedApprover::approving())),
    );
    assert_eq!(
        status(&call(&h, "deploy", json!({"env": "prod"})).await),
        "ran"
    );
}

#[tokio::test]
async fn unattended_grant_runs_an_unsettled_a2_tool_within_its_rules_without_approval() {
    let grant = Grant::new("d", &["deploy"], Authority::A2)
        .rule("args.env == 'staging'")
        .unwrap()
        .unattended(true);
    let h = harness(
        vec![deploy_spec(Settlement::None)],
        Policy::builder().grant(grant).unwrap(),
    );
    assert_eq!(h.session.catalog().len(), 1, "listed");
    assert_eq!(
        status(&call(&h, "deploy", json!({"env": "staging"})).await),
        "ran"
    );
    assert_ne!(
        status(&call(&h, "deploy", json!({"env": "prod"})).await),
        "ran"
    );
}

#[test]
fn unattended_grant_without_rules_is_refused() {
    let err = Policy::builder()
        .grant(Grant::new("d", &["deploy"], Authority::A2).unattended(true))
        .err()
        .expect("refused");
    assert!(err.contains("unattended needs rules"), "{err}");
}

#[test]
fn hidden_tool_says_why() {
    let policy = Policy::builder()
        .grant(Grant::new("d", &["deploy"], Authority::A2))
        .unwrap()
        .build();
    let local = ring0_core::Principal::local();
    let why = policy
        .hidden_because(&deploy_spec(Settlement::None), &local)
        .expect("hidden");
    assert!(why.contains("would have to hold it for approval"), "{why}");
    assert!(
        policy
            .hidden_because(&deploy_spec(Settlement::IdempotencyKey), &local)
            .is_none()
    );
}

#[tokio::test]
async fn shell_string_is_refused_unless_the_grant_allows_a_shell() {
    let spec = ToolSpec::new(
        "shell",
        "",
        json!({"type": "object", "properties": {"argv": {"type": "array", "items": {"type": "string"}}, "command": {"type": "string"}}}),
    )
    .authority(Authority::A2)
    .settlement(Settlement::None);
    let build = |shell: bool| {
        Policy::builder()
            .grant(
                Grant::new("sh", &["shell"], Authority::A2)
                    .approval(true)
                    .shell(shell),
            )
            .unwrap()
            .approver(Arc::new(ScriptedApprover::approving()))
            .shell_arg("shell", "command")
    };
    let h = harness(vec![spec.clone()], build(false));
    let r = call(&h, "shell", json!({"command": "ls | wc"})).await;
    assert_eq!(status(&r), "policy_denied");
    assert!(r["message"].as_str().unwrap().contains("shell:sh"), "{r}");
    assert_eq!(
        status(&call(&h, "shell", json!({"argv": ["ls"]})).await),
        "ran"
    );
    let h = harness(vec![spec], build(true));
    assert_eq!(
        status(&call(&h, "shell", json!({"command": "ls | wc"})).await),
        "ran"
    );
}

type Answer = Box<dyn FnMut(&ApprovalRequest) -> ApprovalOutcome + Send>;

/// An approver that answers from a script and records what it was asked.
struct ScriptedApprover {
    answer: Mutex<Answer>,
    requests: Mutex<Vec<ApprovalRequest>>,
}

impl ScriptedApprover {
    fn new(answer: impl FnMut(&ApprovalRequest) -> ApprovalOutcome + Send + 'static) -> Self {
        Self {
            answer: Mutex::new(Box::new(answer)),
            requests: Mutex::new(Vec::new()),
        }
    }
    fn approving() -> Self {
        Self::new(|r| ApprovalOutcome::Approved {
            args_hash: r.args_hash.clone(),
        })
    }
    fn asked(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
    fn requests(&self) -> Vec<ApprovalRequest> {
        self.requests.lock().unwrap().clone()
    }
}

#[async_trait]
impl Approver for ScriptedApprover {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.requests.lock().unwrap().push(request.clone());
        let outcome = (self.answer.lock().unwrap())(request);
        if outcome == ApprovalOutcome::TimedOut {
            // Never answers: the policy's own deadline must end the wait.
            std::future::pending::<()>().await;
        }
        outcome
    }
}

fn pay_policy(approver: Arc<dyn Approver>) -> ring0_policy::PolicyBuilder {
    Policy::builder()
        .grant(Grant::new("pay", &["pay"], Authority::A3))
        .unwrap()
        .approver(approver)
        .approval_timeout(Duration::from_millis(200))
}

#[tokio::test]
async fn a3_call_is_held_and_runs_once_approved() {
    let approver = Arc::new(ScriptedApprover::approving());
    let h = harness(vec![pay_spec()], pay_policy(approver.clone()));
    let mut events = h.session.subscribe();
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(status(&r), "ran", "{r}");
    let mut held = Vec::new();
    while let Ok(e) = events.try_recv() {
        if let ring0_kernel::Event::ApprovalRequired {
            tool,
            summary,
            args_hash,
            ..
        } = e
        {
            held.push((tool, summary, args_hash));
        }
    }
    assert_eq!(held.len(), 1, "one approval_required event");
    assert_eq!(held[0].0, "pay");
    assert!(held[0].1.contains("A3") && held[0].1.len() <= ring0_policy::SUMMARY_BYTES_MAX);
    let asked = approver.requests();
    assert_eq!(held[0].2, asked[0].args_hash);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].tool, "pay");
    assert!(asked[0].summary.contains("\"amount\":5") && asked[0].summary.contains("A3"));
    assert_eq!(asked[0].args, json!({"to": "bob", "amount": 5}));
    assert!(asked[0].args_whole);
    assert_eq!(asked[0].args, json!({"to": "bob", "amount": 5}));
    assert!(asked[0].args_whole);
    assert!(asked[0].summary.len() <= ring0_policy::SUMMARY_BYTES_MAX);
    let decisions: Vec<AuditDecision> = h.audit.entries().iter().map(|e| e.decision).collect();
    assert_eq!(
        decisions,
        vec![AuditDecision::Held, AuditDecision::Approved]
    );
}

#[tokio::test]
async fn a3_call_denied_by_a_person_is_a_structured_rejection() {
    let approver = Arc::new(ScriptedApprover::new(|_| ApprovalOutcome::Denied {
        reason: "not today".into(),
    }));
    let h = harness(vec![pay_spec()], pay_policy(approver));
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(status(&r), "approval_denied");
    assert!(r["message"].as_str().unwrap().contains("not today"));
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a3_call_without_an_answer_times_out() {
    let approver = Arc::new(ScriptedApprover::new(|_| ApprovalOutcome::TimedOut));
    let h = harness(vec![pay_spec()], pay_policy(approver));
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(status(&r), "approval_timeout");
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        h.audit.entries().last().unwrap().decision,
        AuditDecision::ApprovalTimeout
    );
}

#[tokio::test]
async fn a3_without_an_approval_channel_is_denied() {
    let h = harness(
        vec![pay_spec()],
        Policy::builder()
            .grant(Grant::new("pay", &["pay"], Authority::A3))
            .unwrap(),
    );
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(status(&r), "policy_denied");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains("no approval channel")
    );
}

#[tokio::test]
async fn approval_binds_to_the_arguments_it_was_given_for() {
    let approver = Arc::new(ScriptedApprover::approving());
    let h = harness(vec![pay_spec()], pay_policy(approver.clone()));
    assert_eq!(
        status(&call(&h, "pay", json!({"to": "bob", "amount": 5})).await),
        "ran"
    );
    assert_eq!(approver.asked(), 1);
    // Changed arguments: a new approval is needed.
    assert_eq!(
        status(&call(&h, "pay", json!({"to": "bob", "amount": 6})).await),
        "ran"
    );
    assert_eq!(
        approver.asked(),
        2,
        "changed arguments were put to a person again"
    );
    let hashes: Vec<String> = approver
        .requests()
        .iter()
        .map(|r| r.args_hash.clone())
        .collect();
    assert_ne!(hashes[0], hashes[1]);
}

#[tokio::test]
async fn approval_given_for_other_arguments_does_not_run_the_call() {
    let approver = Arc::new(ScriptedApprover::new(|_| ApprovalOutcome::Approved {
        args_hash: "v1:someone-else".into(),
    }));
    let h = harness(vec![pay_spec()], pay_policy(approver));
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(status(&r), "approval_denied");
    assert!(r["message"].as_str().unwrap().contains("other arguments"));
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn per_tool_rate_limit_refuses_the_call_beyond_the_burst() {
    let grant =
        Grant::new("files", &["read_file"], Authority::A0).rate(RateLimit::parse("2/h").unwrap());
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    for i in 0..2 {
        assert_eq!(
            status(&call(&h, "read_file", json!({"path": format!("{i}")})).await),
            "ran"
        );
    }
    let r = call(&h, "read_file", json!({"path": "3"})).await;
    assert_eq!(status(&r), "rate_limited");
    assert!(r["message"].as_str().unwrap().contains("rate:files"), "{r}");
    let wait = r["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(wait > 60_000, "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .contains(&format!("accepted again in {wait} ms")),
        "{r}"
    );
    assert!(
        !r["advice"].as_str().unwrap().contains("do not retry"),
        "the advice agrees with the message: {r}"
    );
}

#[tokio::test]
async fn session_rate_limit_counts_every_tool() {
    let policy = Policy::builder()
        .grant(Grant::new("all", &["*"], Authority::A1))
        .unwrap()
        .sandboxed_tools(["write_file"])
        .session_rate(RateLimit::parse("2/min").unwrap());
    let h = harness(vec![read_spec(), sandboxed_write_spec()], policy);
    assert_eq!(
        status(&call(&h, "read_file", json!({"path": "a"})).await),
        "ran"
    );
    assert_eq!(
        status(&call(&h, "write_file", json!({"path": "a"})).await),
        "ran"
    );
    let r = call(&h, "read_file", json!({"path": "b"})).await;
    assert!(
        r["message"].as_str().unwrap().contains("rate:session"),
        "{r}"
    );
}

#[tokio::test]
async fn every_decision_is_audited_with_rule_and_fingerprint_but_not_arguments() {
    let grant = Grant::new("files", &["read_file"], Authority::A0)
        .rule("args.path != 'secret'")
        .unwrap();
    let h = harness(vec![read_spec()], Policy::builder().grant(grant).unwrap());
    call(&h, "read_file", json!({"path": "a"})).await;
    call(&h, "read_file", json!({"path": "secret"})).await;
    let entries = h.audit.entries();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].decision, AuditDecision::Allowed);
    assert_eq!(entries[0].rule, "grant:files");
    assert_eq!(entries[1].decision, AuditDecision::Denied);
    assert_eq!(entries[1].rule, "rule:files[0]");
    assert!(
        entries.iter().all(|e| e.args_hash.starts_with("v1:")),
        "{entries:?}"
    );
    assert!(entries.iter().all(|e| e.args.is_none()));
}

#[tokio::test]
async fn audit_records_arguments_only_when_configured() {
    let policy = Policy::builder()
        .grant(Grant::new("files", &["read_file"], Authority::A0))
        .unwrap()
        .audit_args(true);
    let h = harness(vec![read_spec()], policy);
    call(&h, "read_file", json!({"path": "a"})).await;
    assert_eq!(h.audit.entries()[0].args, Some(json!({"path": "a"})));
}

#[tokio::test]
async fn directory_approver_picks_up_a_decision_written_by_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let approvals = dir.path().join("approvals");
    let approver = Arc::new(DirectoryApprover::new(&approvals));
    let h = harness(
        vec![pay_spec()],
        Policy::builder()
            .grant(Grant::new("pay", &["pay"], Authority::A3))
            .unwrap()
            .approver(approver)
            .approval_timeout(Duration::from_secs(30)),
    );
    let decider = {
        let approvals = approvals.clone();
        tokio::spawn(async move {
            // Wait (bounded) for the request to appear, as a person at another terminal would.
            for _ in 0..300 {
                if let Some(pending) = list_pending(&approvals).first() {
                    let yes = Decision {
                        approve: true,
                        remember: false,
                        reason: String::new(),
                    };
                    return decide_pending(&approvals, &pending.id, &yes).map(|r| r.tool);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("no pending request appeared");
        })
    };
    let r = call(&h, "pay", json!({"to": "bob", "amount": 5})).await;
    assert_eq!(decider.await.unwrap().unwrap(), "pay");
    assert_eq!(status(&r), "ran", "{r}");
    assert!(
        list_pending(&approvals).is_empty(),
        "the request file is removed once decided"
    );
}

// ---- Sandbox profiles per grant ----

/// A tool that takes the name of a sandbox profile to run in, as `shell` does.
fn profiled_spec() -> ToolSpec {
    ToolSpec::read(
        "runner",
        "runs",
        json!({"type": "object", "properties": {
            "argv": {"type": "array", "items": {"type": "string"}},
            "sandbox_profile": {"type": "string"}
        }}),
    )
}

fn profiled_policy(grant: Grant) -> ring0_policy::PolicyBuilder {
    Policy::builder()
        .profile_arg("runner", "sandbox_profile")
        .grant(grant)
        .unwrap()
}

#[tokio::test]
async fn a_call_without_a_profile_runs_under_a_grant_that_offers_a_wider_one() {
    let grant = Grant::new("run", &["runner"], Authority::A0).sandbox_wider("net");
    let h = harness(vec![profiled_spec()], profiled_policy(grant));
    let r = call(&h, "runner", json!({"argv": ["true"]})).await;
    assert_eq!(status(&r), "ran", "{r}");
}

#[tokio::test]
async fn a_profile_the_grant_does_not_offer_is_denied_naming_the_grant() {
    let grant = Grant::new("run", &["runner"], Authority::A0).sandbox_wider("net");
    let h = harness(vec![profiled_spec()], profiled_policy(grant));
    let r = call(
        &h,
        "runner",
        json!({"argv": ["true"], "sandbox_profile": "everything"}),
    )
    .await;
    assert_eq!(status(&r), "policy_denied", "{r}");
    assert!(r.to_string().contains("sandbox:run"), "{r}");
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_wider_profile_is_held_for_a_person_and_refused_without_one() {
    let grant = Grant::new("run", &["runner"], Authority::A0).sandbox_wider("net");
    let h = harness(vec![profiled_spec()], profiled_policy(grant));
    let r = call(
        &h,
        "runner",
        json!({"argv": ["true"], "sandbox_profile": "net"}),
    )
    .await;
    assert_ne!(status(&r), "ran", "{r}");
    assert!(r.to_string().contains("sandbox_wider:run"), "{r}");
    assert!(r.to_string().contains("no approval channel"), "{r}");
    assert_eq!(h.runs.load(Ordering::SeqCst), 0);
}

#[test]
fn grant_for_answers_the_grant_that_decides_a_principals_calls() {
    let policy = Policy::builder()
        .grant(
            Grant::new("ops", &["runner"], Authority::A0)
                .principals(["ops"])
                .sandbox("wide"),
        )
        .unwrap()
        .grant(Grant::new("everyone", &["runner"], Authority::A0))
        .unwrap()
        .build();
    let ops = ring0_core::Principal::local();
    let ops = ring0_core::Principal {
        id: "ops".into(),
        ..ops
    };
    assert_eq!(
        policy.grant_for("runner", &ops).map(|g| g.sandbox.clone()),
        Some(Some("wide".into()))
    );
    let local = ring0_core::Principal::local();
    assert_eq!(
        policy.grant_for("runner", &local).map(|g| g.name.as_str()),
        Some("everyone")
    );
    assert!(policy.grant_for("other", &local).is_none());
}
