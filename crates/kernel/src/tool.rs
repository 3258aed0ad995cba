//! The executor seam: what the kernel calls to run a tool.
//!
//! In-process tools implement [`Tool`] directly or through [`tool_fn`]; supervised processes and
//! MCP upstreams implement it in their own crates. The kernel never runs a tool except through
//! this trait, after preparation, admission, planning and commit.

use async_trait::async_trait;
use ring0_core::Observation;
/// The failure and probe vocabulary a tool answers in, shared with the journal's settlement.
pub use ring0_core::{FailureClass, ProbeFinding};
use serde_json::Value;
use std::any::{Any, TypeId};
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// What a tool knows about the call it is running.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// The provider's call id (evidence, for logs).
    pub call_id: String,
    /// The journal's intent id, when the call was committed.
    pub intent_id: Option<String>,
    /// The provider idempotency key derived from the semantic key: pass it to any external API
    /// that honours one, so a re-dispatch after an ambiguous outcome is deduplicated there.
    pub idempotency_key: Option<String>,
    /// The session's user-intent scope.
    pub scope: Arc<str>,
    /// Who the call acts for and in which session, as policy saw them: a tool that starts
    /// something on the call's behalf (a process, its egress) names them in what it records.
    pub session: Arc<crate::policy::SessionInfo>,
    /// Cancelled when the call's deadline passes, or when the session is cancelled for a read or
    /// a tool that stops on cancellation ([`Tool::on_cancel`]); a tool that holds resources
    /// should watch it (dropping the future also cancels).
    pub cancel: CancellationToken,
    /// The per-call timeout in force.
    pub timeout_ms: u64,
    /// The session's event stream, for news that outlives the call (a background job it
    /// started finished, or waits for input).
    pub events: EventSink,
    /// What the host attached to the call's round ([`crate::RoundOptions::extensions`]):
    /// per-call facts of the host's own (where the request came from, how to reach the person
    /// who made it) that the kernel carries to the tool and to authorization untouched.
    pub extensions: CallExtensions,
}

/// Typed values a host attaches to a round's calls, at most one per type.
///
/// The kernel never reads or replaces a host's values: it hands them to every call of the
/// round, in the [`CallContext`] a tool receives and in the [`crate::AuthRequest`] an authorizer
/// decides on, so that per-call context travels with the call instead of through a table keyed
/// by call id. It adds values of its own crate-private types only (the catalog's loaded set,
/// which its meta-tools read).
/// Cloning is cheap (the values are shared).
///
/// ```
/// use ring0_kernel::CallExtensions;
///
/// struct Origin(&'static str);
/// let ext = CallExtensions::new().with(Origin("client-7"));
/// assert_eq!(ext.get::<Origin>().map(|o| o.0), Some("client-7"));
/// assert!(ext.get::<String>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct CallExtensions {
    values: Vec<(TypeId, Arc<dyn Any + Send + Sync>)>,
}

impl CallExtensions {
    /// No values.
    pub fn new() -> Self {
        Self::default()
    }

    /// These extensions with `value`, replacing a value of the same type.
    pub fn with<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.insert(value);
        self
    }

    /// Sets `value`, replacing a value of the same type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        let id = TypeId::of::<T>();
        self.values.retain(|(t, _)| *t != id);
        self.values.push((id, Arc::new(value)));
    }

    /// The value of type `T`, if the host attached one.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let id = TypeId::of::<T>();
        let (_, value) = self.values.iter().find(|(t, _)| *t == id)?;
        value.clone().downcast::<T>().ok()
    }

    /// Whether nothing is attached.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl std::fmt::Debug for CallExtensions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallExtensions")
            .field("values", &self.values.len())
            .finish()
    }
}

/// A handle on a session's event stream that a tool may keep after its call returned.
#[derive(Debug, Clone)]
pub struct EventSink(pub(crate) crate::events::EventHub);

impl EventSink {
    /// A sink nobody listens to (for running a tool outside a session).
    pub fn detached() -> Self {
        Self(crate::events::EventHub::default())
    }

    /// Announces that a call is held for a person's approval.
    pub fn approval_required(
        &self,
        approval_id: &str,
        call_id: &str,
        tool: &str,
        args_hash: &str,
        summary: &str,
        deadline_ms: u64,
    ) {
        self.0.send(crate::events::Event::ApprovalRequired {
            approval_id: approval_id.to_string(),
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            args_hash: args_hash.to_string(),
            summary: summary.to_string(),
            deadline_ms,
        });
    }

    /// Reports a background job's new state to the session.
    pub fn job_update(&self, job: &str, state: &str, detail: Value) {
        self.0.send(crate::events::Event::JobUpdate {
            job: job.to_string(),
            state: state.to_string(),
            detail,
        });
    }
}

/// A tool's failure. Its class decides whether the call settles FAILED (nothing was applied) or
/// UNKNOWN (reconciled by the tool's settlement).
#[derive(Debug, Clone)]
pub struct ToolError {
    pub class: FailureClass,
    pub message: String,
    /// Whatever output the tool produced before failing.
    pub observation: Option<Observation>,
}

impl ToolError {
    /// A failure of the given class (a tool that can tell a timeout or a lost connection apart
    /// says so; the journal's timeline names the class).
    pub fn new(class: FailureClass, message: impl Into<String>) -> Self {
        Self {
            class,
            message: message.into(),
            observation: None,
        }
    }

    /// A failure known to have changed nothing.
    pub fn not_applied(message: impl Into<String>) -> Self {
        Self::new(FailureClass::NotApplied, message)
    }

    /// A failure whose effect is unknown.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(FailureClass::Unknown, message)
    }

    pub fn with_observation(mut self, observation: Observation) -> Self {
        self.observation = Some(observation);
        self
    }
}

/// What cancelling a round does to a mutating call of a tool that was already dispatched.
/// Calls not yet dispatched are cancelled either way, and reads are always told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnCancel {
    /// The call has been sent and its effect may be under way elsewhere, where cancelling it
    /// would only make its outcome unknown: it runs on under its own deadline (the tool's
    /// timeout) and is settled by its protocol as if nothing had been cancelled, its result
    /// recorded for an identical retry. The default.
    #[default]
    Finish,
    /// The tool can observe its own cancellation (a process ring0 runs and kills): the call's
    /// [`CallContext::cancel`] is cancelled with the round, and what the tool then reports is
    /// its outcome.
    Stop,
}

/// A tool the kernel can dispatch.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Runs the call with prepared arguments.
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError>;

    /// What cancelling the round does to a dispatched mutating call ([`OnCancel::Finish`]
    /// unless the tool can observe its own cancellation).
    fn on_cancel(&self) -> OnCancel {
        OnCancel::Finish
    }

    /// A nullipotent snapshot of the state the call will change, taken before dispatch and stored
    /// in the journal for [`Tool::probe`]. Tools settled by probe implement it.
    async fn snapshot(&self, _args: &Value) -> Option<Value> {
        None
    }

    /// A nullipotent reconciliation probe for an ambiguous outcome.
    async fn probe(&self, _args: &Value, _snapshot: Option<&Value>) -> ProbeFinding {
        ProbeFinding::Indeterminate("this tool has no reconciliation probe".into())
    }
}

struct FnTool<F>(F);

#[async_trait]
impl<F, Fut> Tool for FnTool<F>
where
    F: Fn(CallContext, Value) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Observation, ToolError>> + Send,
{
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        (self.0)(ctx, args).await
    }
}

/// Wraps an async function as a [`Tool`].
pub fn tool_fn<F, Fut>(f: F) -> Arc<dyn Tool>
where
    F: Fn(CallContext, Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Observation, ToolError>> + Send + 'static,
{
    Arc::new(FnTool(f))
}
