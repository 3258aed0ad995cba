//! Per-principal policy through the kernel: grants for principals and groups, approvals and rate
//! buckets that never cross principals or sessions, honest refusals, prompts that show the
//! whole arguments, and argvs that smuggle a shell script.

use async_trait::async_trait;
use ring0_core::{Authority, Observation, Principal, ProviderFormat, Settlement, ToolSpec};
use ring0_kernel::{Kernel, RoundOptions, Session, SessionConfig, tool_fn};
use ring0_policy::{
    ApprovalOutcome, ApprovalRequest, ApprovalScope, Approver, AuditDecision, Grant, MemoryAudit,
    Policy, PolicyBuilder, RateLimit,
};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn pay_spec() -> ToolSpec {
    ToolSpec::new(
        "pay",
        "pay",
        json!({"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "integer"}}, "required": ["to", "amount"]}),
    )
    .authority(Authority::A3)
}

fn shell_spec() -> ToolSpec {
    ToolSpec::new(
        "shell",
        "",
        json!({"type": "object", "properties": {"argv": {"type": "array", "items": {"type": "string"}}, "command": {"type": "string"}}}),
    )
    .authority(Authority::A2)
    .settlement(Settlement::None)
}

fn read_spec() -> ToolSpec {
    ToolSpec::read(
        "read_file",
        "read",
        json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
    )
}

/// One policy (shared, as `ring0 serve` shares it) over one kernel, sessions opened on demand.
struct World {
    kernel: Kernel,
    runs: Arc<AtomicUsize>,
    audit: Arc<MemoryAudit>,
}

fn world(specs: Vec<ToolSpec>, policy: PolicyBuilder) -> World {
    let runs = Arc::new(AtomicUsize::new(0));
    let audit = Arc::new(MemoryAudit::new());
    let policy = Arc::new(policy.audit(audit.clone()).build());
    let mut builder = Kernel::builder().authorizer(policy);
    for spec in specs {
        let runs = runs.clone();
        builder = builder
            .tool(
                spec,
                tool_fn(move |_ctx, _args| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok(Observation::text("done"))
                    }
                }),
            )
            .unwrap();
    }
    World {
        kernel: builder.build(),
        runs,
        audit,
    }
}

impl World {
    fn session(&self, principal: Principal) -> Session {
        self.kernel
            .open_session(SessionConfig::new("scope").principal(principal))
    }
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn alice() -> Principal {
    Principal::new("alice").with_groups(["ops".to_string()])
}

fn bob() -> Principal {
    Principal::new("bob")
}

async fn call(session: &Session, tool: &str, input: Value) -> Value {
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": tool, "input": input}
    ]});
    let out = session
        .handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default())
        .await
        .unwrap();
    // The result reached the model: the same call asked again is a genuine repeat.
    out.round.delivered();
    let content = &out.message["content"][0]["content"];
    let text = content
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| content[0]["text"].as_str().unwrap_or_default().to_string());
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

fn status(result: &Value) -> &str {
    result["status"].as_str().unwrap_or("ran")
}

/// Answers every request with `answer` and records what it was asked.
struct Person {
    answer: fn(&ApprovalRequest) -> ApprovalOutcome,
    asked: Mutex<Vec<ApprovalRequest>>,
}

impl Person {
    fn new(answer: fn(&ApprovalRequest) -> ApprovalOutcome) -> Arc<Self> {
        Arc::new(Self {
            answer,
            asked: Mutex::new(Vec::new()),
        })
    }
    fn asked(&self) -> Vec<ApprovalRequest> {
        self.asked.lock().unwrap().clone()
    }
}

#[async_trait]
impl Approver for Person {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.asked.lock().unwrap().push(request.clone());
        (self.answer)(request)
    }
}

fn for_session(r: &ApprovalRequest) -> ApprovalOutcome {
    ApprovalOutcome::ApprovedForSession {
        args_hash: r.args_hash.clone(),
    }
}

fn once(r: &ApprovalRequest) -> ApprovalOutcome {
    ApprovalOutcome::Approved {
        args_hash: r.args_hash.clone(),
    }
}

fn pay_policy(person: Arc<Person>, scope: ApprovalScope) -> PolicyBuilder {
    Policy::builder()
        .grant(Grant::new("pay", &["pay"], Authority::A3).approval_scope(scope))
        .unwrap()
        .approver(person)
        .approval_timeout(Duration::from_secs(5))
}

#[tokio::test]
async fn a_grant_naming_principals_or_groups_applies_to_them_alone() {
    let policy = Policy::builder()
        .grant(Grant::new("ops", &["read_file"], Authority::A0).groups(["ops"]))
        .unwrap()
        .grant(Grant::new("bob", &["read_file"], Authority::A0).principals(["bob"]))
        .unwrap();
    let w = world(vec![read_spec()], policy);
    assert_eq!(
        status(&call(&w.session(alice()), "read_file", json!({"path": "a"})).await),
        "ran"
    );
    assert_eq!(
        status(&call(&w.session(bob()), "read_file", json!({"path": "a"})).await),
        "ran"
    );
    let carol = w.session(Principal::new("carol"));
    assert!(
        carol.catalog().is_empty(),
        "carol sees no tool she may not call"
    );
    let r = call(&carol, "read_file", json!({"path": "a"})).await;
    assert_ne!(status(&r), "ran", "{r}");
    let rules: Vec<(String, String)> = w
        .audit
        .entries()
        .into_iter()
        .map(|e| (e.principal, e.rule))
        .collect();
    assert_eq!(rules[0], ("alice".into(), "grant:ops".into()));
    assert_eq!(rules[1], ("bob".into(), "grant:bob".into()));
}

#[tokio::test]
async fn rules_see_the_principal_and_its_claims() {
    let policy = Policy::builder()
        .grant(
            Grant::new("tenant", &["read_file"], Authority::A0)
                .rule("args.path.startsWith(principal.claims.tenant + '/')")
                .unwrap(),
        )
        .unwrap();
    let w = world(vec![read_spec()], policy);
    let mut p = Principal::new("svc");
    p.claims.insert("tenant".into(), json!("acme"));
    let s = w.session(p);
    assert_eq!(
        status(&call(&s, "read_file", json!({"path": "acme/x"})).await),
        "ran"
    );
    let r = call(&s, "read_file", json!({"path": "other/x"})).await;
    assert_eq!(status(&r), "policy_denied", "{r}");
}

#[tokio::test]
async fn an_approval_for_the_session_never_releases_the_call_in_another_session() {
    let person = Person::new(for_session);
    let w = world(
        vec![pay_spec()],
        pay_policy(person.clone(), ApprovalScope::Session),
    );
    let args = json!({"to": "bob", "amount": 5});
    let first = w.session(alice());
    assert_eq!(status(&call(&first, "pay", args.clone()).await), "ran");
    assert_eq!(status(&call(&first, "pay", args.clone()).await), "ran");
    assert_eq!(
        person.asked().len(),
        1,
        "the identical call ran without asking again"
    );
    let second = w.session(alice());
    assert_eq!(status(&call(&second, "pay", args.clone()).await), "ran");
    assert_eq!(
        person.asked().len(),
        2,
        "another session of the same principal asks again"
    );
    assert_eq!(person.asked()[0].remember.as_deref(), Some("this session"));
    assert_ne!(person.asked()[0].session_id, person.asked()[1].session_id);
}

#[tokio::test]
async fn an_approval_given_to_one_principal_never_releases_anothers_call() {
    let person = Person::new(for_session);
    let w = world(
        vec![pay_spec()],
        pay_policy(person.clone(), ApprovalScope::Session),
    );
    let args = json!({"to": "bob", "amount": 5});
    // Both sessions carry the same host-given id: only the principal tells them apart.
    let open = |p: Principal| {
        w.kernel.open_session(
            SessionConfig::new("scope")
                .principal(p)
                .session_id("shared"),
        )
    };
    assert_eq!(
        status(&call(&open(alice()), "pay", args.clone()).await),
        "ran"
    );
    assert_eq!(
        status(&call(&open(bob()), "pay", args.clone()).await),
        "ran"
    );
    let asked: Vec<String> = person.asked().into_iter().map(|r| r.principal).collect();
    assert_eq!(asked, ["alice", "bob"]);
}

#[tokio::test]
async fn once_approves_only_the_call_it_was_given_for() {
    let person = Person::new(for_session);
    let w = world(
        vec![pay_spec()],
        pay_policy(person.clone(), ApprovalScope::Once),
    );
    let s = w.session(alice());
    let args = json!({"to": "bob", "amount": 5});
    assert_eq!(status(&call(&s, "pay", args.clone()).await), "ran");
    assert_eq!(status(&call(&s, "pay", args.clone()).await), "ran");
    assert_eq!(
        person.asked().len(),
        2,
        "with approval_scope once a session answer counts for one call"
    );
    assert_eq!(person.asked()[0].remember, None, "nothing more is offered");
}

#[tokio::test]
async fn a_session_approval_covers_identical_calls_only() {
    let person = Person::new(for_session);
    let w = world(
        vec![pay_spec()],
        pay_policy(person.clone(), ApprovalScope::Session),
    );
    let s = w.session(alice());
    call(&s, "pay", json!({"to": "bob", "amount": 5})).await;
    call(&s, "pay", json!({"to": "bob", "amount": 6})).await;
    assert_eq!(person.asked().len(), 2, "changed arguments are asked again");
}

#[tokio::test]
async fn a_plain_approval_is_not_remembered_even_where_the_session_is_offered() {
    let person = Person::new(once);
    let w = world(
        vec![pay_spec()],
        pay_policy(person.clone(), ApprovalScope::Session),
    );
    let s = w.session(alice());
    let args = json!({"to": "bob", "amount": 5});
    call(&s, "pay", args.clone()).await;
    call(&s, "pay", args).await;
    assert_eq!(person.asked().len(), 2);
}

#[tokio::test]
async fn a_call_waiting_for_a_person_says_so_and_what_to_do_next() {
    let person = Person::new(|_| ApprovalOutcome::Pending {
        next: "ask the user for the code, then call again with it".into(),
    });
    let w = world(vec![pay_spec()], pay_policy(person, ApprovalScope::Once));
    let r = call(
        &w.session(alice()),
        "pay",
        json!({"to": "bob", "amount": 5}),
    )
    .await;
    assert_eq!(status(&r), "approval_required", "{r}");
    let message = r["message"].as_str().unwrap();
    assert!(message.contains("call again with it"), "{r}");
    assert!(!message.contains("denied"), "nobody denied it: {r}");
    let advice = r["advice"].as_str().unwrap();
    assert!(
        !advice.contains("do not retry") && advice.contains("call again"),
        "{r}"
    );
    assert_eq!(w.runs(), 0);
    let decisions: Vec<AuditDecision> = w.audit.entries().iter().map(|e| e.decision).collect();
    assert_eq!(
        decisions,
        [AuditDecision::Held, AuditDecision::ApprovalRequired]
    );
}

#[tokio::test]
async fn one_principal_exhausting_its_quota_leaves_anothers_untouched() {
    let policy = Policy::builder()
        .grant(
            Grant::new("files", &["read_file"], Authority::A0)
                .rate(RateLimit::parse("2/h").unwrap()),
        )
        .unwrap();
    let w = world(vec![read_spec()], policy);
    let a = w.session(alice());
    for i in 0..2 {
        assert_eq!(
            status(&call(&a, "read_file", json!({"path": format!("{i}")})).await),
            "ran"
        );
    }
    assert_eq!(
        status(&call(&a, "read_file", json!({"path": "x"})).await),
        "rate_limited"
    );
    // A new session of the same principal shares its bucket: re-initializing resets nothing.
    let again = w.session(alice());
    let r = call(&again, "read_file", json!({"path": "y"})).await;
    assert_eq!(status(&r), "rate_limited", "{r}");
    assert!(r["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{r}");
    let b = w.session(bob());
    assert_eq!(
        status(&call(&b, "read_file", json!({"path": "x"})).await),
        "ran"
    );
}

#[tokio::test]
async fn principal_rate_counts_every_session_of_the_principal() {
    let policy = Policy::builder()
        .grant(Grant::new("files", &["read_file"], Authority::A0))
        .unwrap()
        .principal_rate(RateLimit::parse("1/h").unwrap());
    let w = world(vec![read_spec()], policy);
    assert_eq!(
        status(&call(&w.session(alice()), "read_file", json!({"path": "a"})).await),
        "ran"
    );
    let r = call(&w.session(alice()), "read_file", json!({"path": "b"})).await;
    assert!(
        r["message"].as_str().unwrap().contains("rate:principal"),
        "{r}"
    );
    assert_eq!(
        status(&call(&w.session(bob()), "read_file", json!({"path": "a"})).await),
        "ran"
    );
}

#[tokio::test]
async fn session_rate_is_per_session() {
    let policy = Policy::builder()
        .grant(Grant::new("files", &["read_file"], Authority::A0))
        .unwrap()
        .session_rate(RateLimit::parse("1/h").unwrap());
    let w = world(vec![read_spec()], policy);
    let a = w.session(alice());
    assert_eq!(
        status(&call(&a, "read_file", json!({"path": "a"})).await),
        "ran"
    );
    let r = call(&a, "read_file", json!({"path": "b"})).await;
    assert!(
        r["message"].as_str().unwrap().contains("rate:session"),
        "{r}"
    );
    assert_eq!(
        status(&call(&w.session(alice()), "read_file", json!({"path": "a"})).await),
        "ran"
    );
}

fn shell_policy(person: Arc<Person>, shell: bool) -> PolicyBuilder {
    Policy::builder()
        .grant(
            Grant::new("sh", &["shell"], Authority::A2)
                .approval(true)
                .shell(shell),
        )
        .unwrap()
        .approver(person)
        .shell_arg("shell", "command")
        .argv_arg("shell", "argv")
}

#[tokio::test]
async fn an_argv_that_starts_an_inline_script_is_a_command_string() {
    let person = Person::new(once);
    let w = world(vec![shell_spec()], shell_policy(person.clone(), false));
    let s = w.session(Principal::local());
    for argv in [
        json!(["sh", "-c", "id"]),
        json!(["/bin/bash", "-c", "id"]),
        json!(["python3", "-c", "import os"]),
        json!(["node", "-e", "1"]),
        json!(["env", "FOO=1", "sh", "-c", "id"]),
    ] {
        let r = call(&s, "shell", json!({"argv": argv})).await;
        assert_eq!(status(&r), "policy_denied", "{argv}: {r}");
        assert!(
            r["message"].as_str().unwrap().contains("inline script"),
            "{r}"
        );
    }
    assert!(
        person.asked().is_empty(),
        "nobody is asked about a refused call"
    );
    assert_eq!(
        status(&call(&s, "shell", json!({"argv": ["ls", "-la"]})).await),
        "ran"
    );
    let w = world(vec![shell_spec()], shell_policy(Person::new(once), true));
    let s = w.session(Principal::local());
    assert_eq!(
        status(&call(&s, "shell", json!({"argv": ["sh", "-c", "id"]})).await),
        "ran"
    );
}

#[tokio::test]
async fn the_person_is_shown_padding_and_the_hidden_tail() {
    let person = Person::new(|_| ApprovalOutcome::Denied {
        reason: "no".into(),
    });
    let w = world(vec![shell_spec()], shell_policy(person.clone(), false));
    let padded = format!("{}; echo pwned > tail.txt", " ".repeat(1200));
    call(
        &w.session(Principal::local()),
        "shell",
        json!({"argv": ["echo", padded]}),
    )
    .await;
    let asked = &person.asked()[0];
    assert!(
        asked.args_whole,
        "the arguments fit once the padding is counted"
    );
    assert!(
        asked
            .args_shown
            .contains("⟪1200 spaces⟫; echo pwned > tail.txt"),
        "{}",
        asked.args_shown
    );
    assert!(
        asked.summary.contains("; echo pwned > tail.txt"),
        "{}",
        asked.summary
    );
    assert!(
        asked.summary.contains(&asked.args_hash),
        "the digest is quoted"
    );
}

#[tokio::test]
async fn arguments_too_long_to_show_point_to_where_they_are_shown_whole() {
    let person = Person::new(|_| ApprovalOutcome::Denied {
        reason: "no".into(),
    });
    let w = world(vec![shell_spec()], shell_policy(person.clone(), false));
    let words: Vec<String> = (0..2000).map(|i| format!("w{i}")).collect();
    call(
        &w.session(Principal::local()),
        "shell",
        json!({"argv": words}),
    )
    .await;
    let asked = &person.asked()[0];
    assert!(!asked.args_whole);
    assert!(asked.args_shown.len() <= ring0_policy::ARGS_SHOWN_BYTES_MAX);
    assert!(
        asked
            .args_shown
            .contains(&format!("ring0 approve --show {}", asked.id)),
        "{}",
        asked.args_shown
    );
    assert_eq!(
        asked.args["argv"][1999], "w1999",
        "the request holds them whole"
    );
}

#[tokio::test]
async fn a_terminal_session_approval_is_remembered_only_where_offered() {
    use ring0_policy::{ApprovalError, Decision, DirectoryApprover, decide_pending, list_pending};
    let dir = tempfile::tempdir().unwrap();
    let approvals = dir.path().join("approvals");
    let policy = Policy::builder()
        .grant(Grant::new("pay", &["pay"], Authority::A3).approval_scope(ApprovalScope::Session))
        .unwrap()
        .grant(Grant::new("shell", &["shell"], Authority::A2).approval(true))
        .unwrap()
        .approver(Arc::new(DirectoryApprover::new(&approvals)))
        .approval_timeout(Duration::from_secs(30));
    let w = world(vec![pay_spec(), shell_spec()], policy);
    let s = w.session(alice());
    let decide = |remember: bool| {
        let approvals = approvals.clone();
        tokio::spawn(async move {
            for _ in 0..600 {
                if let Some(pending) = list_pending(&approvals).first() {
                    let d = Decision {
                        approve: true,
                        remember,
                        reason: String::new(),
                    };
                    return decide_pending(&approvals, &pending.id, &d);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("no pending request appeared");
        })
    };
    let args = json!({"to": "bob", "amount": 5});
    let person = decide(true);
    assert_eq!(status(&call(&s, "pay", args.clone()).await), "ran");
    assert!(person.await.unwrap().unwrap().remember.is_some());
    assert_eq!(
        status(&call(&s, "pay", args).await),
        "ran",
        "remembered: nobody asked"
    );
    // A grant with approval_scope once refuses "--session" and the call waits on.
    let refused = decide(true);
    let held = tokio::spawn({
        let s = w.session(alice());
        async move { call(&s, "shell", json!({"argv": ["ls"]})).await }
    });
    assert!(matches!(
        refused.await.unwrap(),
        Err(ApprovalError::RememberNotOffered { .. })
    ));
    decide(false).await.unwrap().unwrap();
    assert_eq!(status(&held.await.unwrap()), "ran");
}
