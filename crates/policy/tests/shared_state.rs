//! A policy whose rate buckets and remembered approvals live in a shared state
//! (`PolicyBuilder::shared_state`, a PostgreSQL journal's in a deployment): two policies — two
//! replicas — sharing one state limit a principal as one and honour each other's "allow for
//! this session"; a state that fails refuses the call, never lets it past its limit.

use async_trait::async_trait;
use ring0_core::{Authority, Effect, Observation, ProviderFormat, Settlement, Strategy, ToolSpec};
use ring0_journal::{JournalError, RateTaken, SharedState};
use ring0_kernel::{Kernel, RoundOptions, SessionConfig, Tool, tool_fn};
use ring0_policy::{
    ApprovalOutcome, ApprovalRequest, ApprovalScope, Approver, Grant, Policy, PolicyBuilder,
    RateLimit,
};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A shared state in memory: GCRA buckets on a frozen clock, remembered approvals without
/// expiry; `broken` fails every request.
#[derive(Default)]
struct MemoryState {
    tats: Mutex<HashMap<String, Duration>>,
    remembered: Mutex<HashMap<String, String>>,
    broken: bool,
}

#[async_trait]
impl SharedState for MemoryState {
    async fn rate_take(
        &self,
        bucket: &str,
        burst: u32,
        interval: Duration,
    ) -> Result<RateTaken, JournalError> {
        if self.broken {
            return Err(JournalError::Storage("the database is down".into()));
        }
        let mut tats = self.tats.lock().unwrap();
        let tat = tats.entry(bucket.to_string()).or_default();
        if *tat + interval <= interval * burst {
            *tat += interval;
            return Ok(RateTaken::Allowed);
        }
        Ok(RateTaken::Refused {
            retry_after: *tat - interval * (burst - 1),
        })
    }

    async fn approval_remember(
        &self,
        key: &str,
        approval_id: &str,
        _ttl: Option<Duration>,
    ) -> Result<(), JournalError> {
        self.remembered
            .lock()
            .unwrap()
            .insert(key.into(), approval_id.into());
        Ok(())
    }

    async fn approval_remembered(&self, key: &str) -> Result<Option<String>, JournalError> {
        if self.broken {
            return Err(JournalError::Storage("the database is down".into()));
        }
        Ok(self.remembered.lock().unwrap().get(key).cloned())
    }

    async fn pins_publish(
        &self,
        _: &[ring0_journal::shared::PinApproval],
    ) -> Result<(), JournalError> {
        Ok(())
    }

    async fn pins_since(
        &self,
        _: i64,
    ) -> Result<Vec<(i64, ring0_journal::shared::PinApproval)>, JournalError> {
        Ok(Vec::new())
    }

    async fn loaded_add(
        &self,
        _: &str,
        _: &str,
        _: &[String],
        _: usize,
        _: ring0_journal::shared::LoadedFits,
    ) -> Result<ring0_journal::shared::LoadedAdd, JournalError> {
        Err(JournalError::Storage("no loaded sets here".into()))
    }

    async fn loaded_names(&self, _: &str, _: &str) -> Result<Vec<String>, JournalError> {
        Ok(Vec::new())
    }
}

/// Approves every call for the session, counting the people it asked.
struct ForSession(AtomicUsize);

#[async_trait]
impl Approver for ForSession {
    async fn decide(&self, request: &ApprovalRequest) -> ApprovalOutcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        ApprovalOutcome::ApprovedForSession {
            args_hash: request.args_hash.clone(),
        }
    }
}

fn deploy_spec() -> ToolSpec {
    ToolSpec::new(
        "deploy",
        "deploy",
        json!({"type": "object", "properties": {"env": {"type": "string"}}}),
    )
    .effect(Effect::NonIdempotent)
    .authority(Authority::A2)
    .strategy(&[Strategy::Exploitation])
    .settlement(Settlement::IdempotencyKey)
}

/// One replica: a kernel whose policy keeps its state in `state`, a session of `scope`.
fn replica(
    policy: PolicyBuilder,
    state: Arc<dyn SharedState>,
    scope: &str,
    runs: &Arc<AtomicUsize>,
) -> ring0_kernel::Session {
    let runs = runs.clone();
    let tool: Arc<dyn Tool> = tool_fn(move |_ctx, _args| {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Observation::json(json!({"ok": true})))
        }
    });
    let kernel = Kernel::builder().tool(deploy_spec(), tool).unwrap().build();
    let policy: Policy = policy.shared_state(state).build();
    // As a front end names them: the session is the conversation's scope (MCP does this).
    let config = SessionConfig::new(scope).session_id(scope.to_string());
    kernel.open_session(config.authorizer(Arc::new(policy)))
}

/// One call of `deploy` and its model-visible status (`ran` when it ran).
async fn deploy(session: &ring0_kernel::Session, env: &str) -> String {
    let turn = json!({"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "deploy", "input": {"env": env}}
    ]});
    let out = session
        .handle_turn(ProviderFormat::Anthropic, &turn, &RoundOptions::default())
        .await
        .unwrap();
    let content = &out.message["content"][0]["content"];
    let text = content
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| content[0]["text"].as_str().unwrap_or_default().to_string());
    let result: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    result["status"].as_str().unwrap_or("ran").to_string()
}

fn limited() -> PolicyBuilder {
    Policy::builder()
        .grant(Grant::new("deploys", &["deploy"], Authority::A2))
        .unwrap()
        .principal_rate(RateLimit::parse("3/h").unwrap())
}

#[tokio::test]
async fn a_principal_limited_on_two_replicas_sharing_its_bucket_is_limited_as_one() {
    let state: Arc<dyn SharedState> = Arc::new(MemoryState::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let a = replica(limited(), state.clone(), "s", &runs);
    let b = replica(limited(), state, "s", &runs);
    let mut statuses = Vec::new();
    for i in 0..6 {
        let on = if i % 2 == 0 { &a } else { &b };
        statuses.push(deploy(on, &format!("env-{i}")).await);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| *s == "rate_limited").count(),
        3,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn a_shared_state_that_fails_refuses_the_call() {
    let state: Arc<dyn SharedState> = Arc::new(MemoryState {
        broken: true,
        ..MemoryState::default()
    });
    let runs = Arc::new(AtomicUsize::new(0));
    let a = replica(limited(), state, "s", &runs);
    let status = deploy(&a, "prod").await;
    assert_ne!(status, "ran");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_approval_for_the_session_given_on_one_replica_is_honoured_on_another() {
    let state: Arc<dyn SharedState> = Arc::new(MemoryState::default());
    let asked = Arc::new(ForSession(AtomicUsize::new(0)));
    let held = || {
        Policy::builder()
            .grant(
                Grant::new("deploys", &["deploy"], Authority::A2)
                    .approval(true)
                    .approval_scope(ApprovalScope::Session),
            )
            .unwrap()
            .approver(asked.clone())
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let a = replica(held(), state.clone(), "conversation-1", &runs);
    let b = replica(held(), state.clone(), "conversation-1", &runs);
    assert_eq!(deploy(&a, "prod").await, "ran");
    assert_eq!(deploy(&b, "prod").await, "ran");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(asked.0.load(Ordering::SeqCst), 1, "asked once, on A");
    // Another conversation (session) of the same principal is asked again.
    let c = replica(held(), state, "conversation-2", &runs);
    assert_eq!(deploy(&c, "prod").await, "ran");
    assert_eq!(asked.0.load(Ordering::SeqCst), 2);
}

/// The same on the shared state of real PostgreSQL journals, two replicas of one database (the
/// one `RING0_TEST_POSTGRES_URL` names; skipped without it): an approval for the session given
/// through one is honoured by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_remembered_in_postgresql_is_honoured_by_another_replica() {
    let Some(url) = std::env::var("RING0_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        // Under CI the suite must not pass without having run.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "RING0_TEST_POSTGRES_URL is not set under CI"
        );
        eprintln!(
            "skipped: RING0_TEST_POSTGRES_URL is not set (scripts/test.sh starts a database)"
        );
        return;
    };
    let open = || {
        let options = ring0_journal::PostgresOptions {
            pool_connections: 2,
            ..ring0_journal::PostgresOptions::default()
        };
        ring0_journal::PostgresJournal::open(&url, options).unwrap()
    };
    use ring0_journal::Journal;
    let (ja, jb) = (open(), open());
    let asked = Arc::new(ForSession(AtomicUsize::new(0)));
    let held = || {
        Policy::builder()
            .grant(
                Grant::new("deploys", &["deploy"], Authority::A2)
                    .approval(true)
                    .approval_scope(ApprovalScope::Session),
            )
            .unwrap()
            .approver(asked.clone())
    };
    // A conversation of its own: the database may hold others' remembered approvals.
    let scope = format!("conversation-{}", std::process::id());
    let runs = Arc::new(AtomicUsize::new(0));
    let a = replica(held(), ja.shared_state().unwrap(), &scope, &runs);
    let b = replica(held(), jb.shared_state().unwrap(), &scope, &runs);
    let env = format!("prod-{:?}", std::time::SystemTime::now());
    assert_eq!(deploy(&a, &env).await, "ran");
    assert_eq!(deploy(&b, &env).await, "ran");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(asked.0.load(Ordering::SeqCst), 1, "asked once, through A");
}
