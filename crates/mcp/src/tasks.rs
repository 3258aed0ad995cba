//! Background shell jobs and long upstream calls as MCP tasks (the tasks extension,
//! `io.modelcontextprotocol/tasks`).
//!
//! When the client declares the extension, two kinds of `tools/call` answer with a task instead
//! of making the client wait:
//! - `shell` with `background: true`: the call starts the job (a kernel round like any other,
//!   approval included) and the task follows the job. A watcher waits for the job through the
//!   kernel (`job_wait`); `tasks/get` reports `working` with the job's state and last lines of
//!   output (`job_inspect`), then `completed` with the job's shaped output; `tasks/cancel` stops
//!   the job's whole process tree (`job_cancel`) and the task reports `cancelled`.
//! - a call to an upstream tool that is still running after [`TASK_PROMOTE_AFTER`]: the round
//!   goes on in the background and the task reports its result when it settles; `tasks/cancel`
//!   cancels the round, which sends `notifications/cancelled` upstream and lets the journal
//!   settle a mutating call. A call that finishes sooner is answered directly.
//!
//! Every job operation is itself a kernel round (validated, authorized, journaled). Clients
//! without the extension keep the job tools. Task ids are 128 random bits, bound to the
//! downstream session that created them (in the stateless 2026-07-28 era there is no session:
//! the unguessable id is the capability); an unknown id and another session's id get the same
//! answer. Tasks are bounded in number ([`TASKS_MAX`], [`TASKS_PER_SESSION_MAX`]): at the bound
//! the oldest finished task makes room, and when none has finished the call is answered the
//! ordinary way. A finished task is kept for [`TASK_RETAIN_AFTER_DONE`]. With a shared journal,
//! a job task is recorded there (`ring0_journal::SharedTask`): another replica answers its
//! `tasks/get` and `tasks/cancel` through the job tools, which read the job's shared record. A
//! long upstream call's task lives only on the replica running the call.

use crate::limits::{
    TASK_INSPECT_INTERVAL_MIN, TASK_JOB_WAIT_SLICE, TASK_POLL_INTERVAL_MS, TASK_PROMOTE_AFTER,
    TASK_RETAIN_AFTER_DONE, TASK_STATUS_BYTES_MAX, TASKS_MAX, TASKS_PER_SESSION_MAX,
};
use crate::lossless::{RawKind, adapt_to_era};
use crate::server::GatewayServer;
use ring0_core::receipt::CallOutcome;
use ring0_core::{ProposedArguments, ProposedCall, Round};
use ring0_kernel::{RoundOptions, SessionConfig};
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CreateTaskResult, DetailedTask,
    ErrorData, GetTaskParams, GetTaskResult, JsonObject, Task, TaskPayload, TaskStatus,
};
use rmcp::service::RequestContext;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// `_meta` key of a job task's job handle (usable with the job tools too).
pub const JOB_META_KEY: &str = "io.ring0/job";

/// The job tools a job task runs its operations through.
const JOB_TOOLS: [&str; 3] = ["job_wait", "job_inspect", "job_cancel"];

/// The owner of tasks created by stateless requests (which have no session).
const STATELESS_OWNER: &str = "stateless";

static TASK_CALL_COUNTER: AtomicU64 = AtomicU64::new(1);

enum Work {
    /// Not yet decided: the call may still be answered directly.
    Pending,
    Job {
        job: String,
        scope: String,
    },
    Call {
        cancel: CancellationToken,
    },
}

struct State {
    status: TaskStatus,
    message: Option<String>,
    result: Option<JsonObject>,
    error: Option<JsonObject>,
    updated: SystemTime,
    finished: Option<Instant>,
    cancel_requested: bool,
    /// When `job_inspect` last refreshed the status message (each one is a journaled round).
    inspected: Option<Instant>,
    work: Work,
    /// The delivery of the call's result, reported when the result is handed to the client.
    delivery: Option<crate::delivery::Delivery>,
}

/// One task.
pub struct TaskRecord {
    id: String,
    owner: String,
    created: SystemTime,
    /// The era of the request that created it: its result is rendered for that era.
    modern: bool,
    state: Mutex<State>,
}

impl TaskRecord {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finish(&self, status: TaskStatus, result: Option<JsonObject>, error: Option<JsonObject>) {
        let mut s = self.lock();
        if s.status.is_terminal() {
            return;
        }
        s.status = status;
        s.result = result;
        s.error = error;
        s.updated = SystemTime::now();
        s.finished = Some(Instant::now());
    }

    fn finished_at(&self) -> Option<Instant> {
        self.lock().finished
    }

    fn task(&self) -> Task {
        let s = self.lock();
        let mut t = Task::new(self.id.clone(), s.status, iso(self.created), iso(s.updated))
            .with_poll_interval_ms(TASK_POLL_INTERVAL_MS);
        // Kept until TASK_RETAIN_AFTER_DONE after it finished; while it runs there is no end.
        t.ttl_ms = s.finished.map(|f| {
            let lived = SystemTime::now()
                .duration_since(self.created)
                .unwrap_or_default()
                .saturating_sub(f.elapsed());
            (lived + TASK_RETAIN_AFTER_DONE).as_millis() as u64
        });
        if let Some(m) = &s.message {
            t = t.with_status_message(m.clone());
        }
        t
    }

    fn detailed(&self) -> DetailedTask {
        let task = self.task();
        let s = self.lock();
        let payload = match s.status {
            TaskStatus::Completed => TaskPayload::Completed {
                result: s.result.clone().unwrap_or_default(),
            },
            TaskStatus::Failed => TaskPayload::Failed {
                error: s.error.clone().unwrap_or_default(),
            },
            TaskStatus::Cancelled => TaskPayload::Cancelled,
            _ => TaskPayload::Working,
        };
        DetailedTask::new(task, payload)
    }
}

fn iso(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The tasks of every session of one endpoint.
#[derive(Default)]
pub struct TaskTable {
    tasks: Mutex<HashMap<String, Arc<TaskRecord>>>,
    /// The deployment's shared journal: a job task is recorded there, so that another replica
    /// answers `tasks/get` and `tasks/cancel` through the job tools (which read the job's
    /// shared record).
    shared: std::sync::OnceLock<Arc<dyn ring0_journal::Deployment>>,
}

impl TaskTable {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Records job tasks in the deployment's shared journal from now on (once).
    pub fn share(&self, deployment: Arc<dyn ring0_journal::Deployment>) {
        let _ = self.shared.set(deployment);
    }

    /// Records that task `task` follows `job` in `scope`, for the other replicas (best effort:
    /// this replica answers it either way).
    async fn publish(&self, task: &TaskRecord, job: &str, scope: &str) {
        if let Some(deployment) = self.shared.get() {
            let record = ring0_journal::SharedTask {
                task_id: task.id.clone(),
                owner: task.owner.clone(),
                job: job.to_string(),
                scope: scope.to_string(),
                modern: task.modern,
                cancelled: false,
            };
            let _ = deployment.task_put(&record).await;
        }
    }

    /// Records that task `id` was cancelled, for the other replicas (best effort).
    async fn publish_cancel(&self, id: &str) {
        if let Some(deployment) = self.shared.get() {
            let _ = deployment.task_cancelled(id).await;
        }
    }

    /// Whether a client cancelled task `id` through another replica.
    async fn cancelled_elsewhere(&self, id: &str) -> bool {
        match self.shared.get() {
            Some(deployment) => matches!(deployment.task_get(id).await, Ok(Some(t)) if t.cancelled),
            None => false,
        }
    }

    /// The task `id` of `owner`: this replica's, or a job task another replica created, from
    /// its shared record (a stand-in that follows the job through the job tools).
    async fn find_anywhere(&self, id: &str, owner: &str) -> Result<Arc<TaskRecord>, ErrorData> {
        let local = self.find(id, owner);
        if local.is_ok() {
            return local;
        }
        let Some(deployment) = self.shared.get() else {
            return local;
        };
        match deployment.task_get(id).await {
            Ok(Some(shared)) if shared.owner == owner => {
                let now = SystemTime::now();
                Ok(Arc::new(TaskRecord {
                    id: shared.task_id,
                    owner: shared.owner,
                    created: now,
                    modern: shared.modern,
                    state: Mutex::new(State {
                        status: TaskStatus::Working,
                        message: None,
                        result: None,
                        error: None,
                        updated: now,
                        finished: None,
                        cancel_requested: shared.cancelled,
                        inspected: None,
                        work: Work::Job {
                            job: shared.job,
                            scope: shared.scope,
                        },
                        delivery: None,
                    }),
                }))
            }
            _ => local,
        }
    }

    /// Tasks held (for tests of the bounds).
    pub fn len(&self) -> usize {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A new task of `owner`, or `None` at the bound with nothing finished to make room.
    fn create(&self, owner: &str, modern: bool) -> Option<Arc<TaskRecord>> {
        let now = Instant::now();
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|_, t| {
            t.lock()
                .finished
                .is_none_or(|f| now.duration_since(f) < TASK_RETAIN_AFTER_DONE)
        });
        let oldest_finished = |tasks: &HashMap<String, Arc<TaskRecord>>, owner: Option<&str>| {
            tasks
                .values()
                .filter(|t| owner.is_none_or(|o| t.owner == o))
                .filter_map(|t| t.finished_at().map(|f| (f, t.id.clone())))
                .min()
                .map(|(_, id)| id)
        };
        if tasks.values().filter(|t| t.owner == owner).count() >= TASKS_PER_SESSION_MAX {
            let id = oldest_finished(&tasks, Some(owner))?;
            tasks.remove(&id);
        }
        if tasks.len() >= TASKS_MAX {
            let id = oldest_finished(&tasks, None)?;
            tasks.remove(&id);
        }
        let now_wall = SystemTime::now();
        let record = Arc::new(TaskRecord {
            id: format!("task_{}", uuid::Uuid::new_v4().simple()),
            owner: owner.to_string(),
            created: now_wall,
            modern,
            state: Mutex::new(State {
                status: TaskStatus::Working,
                message: None,
                result: None,
                error: None,
                updated: now_wall,
                finished: None,
                cancel_requested: false,
                inspected: None,
                work: Work::Pending,
                delivery: None,
            }),
        });
        tasks.insert(record.id.clone(), record.clone());
        Some(record)
    }

    fn remove(&self, id: &str) {
        self.tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// The task `id` if `owner` created it: another session's task is as unknown as a missing one.
    fn find(&self, id: &str, owner: &str) -> Result<Arc<TaskRecord>, ErrorData> {
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        match tasks.get(id) {
            Some(t) if t.owner == owner => Ok(t.clone()),
            _ => Err(ErrorData::invalid_params(
                format!(
                    "unknown task {:?}: no task of this session has that id (finished tasks are \
                     kept {} s)",
                    id.chars().take(64).collect::<String>(),
                    TASK_RETAIN_AFTER_DONE.as_secs()
                ),
                None,
            )),
        }
    }
}

/// Who a request's tasks belong to: its session, or the stateless requests of its principal.
fn owner_of(server: &GatewayServer, context: &RequestContext<RoleServer>) -> String {
    let http = context.extensions.get::<http::request::Parts>();
    match http {
        Some(parts) if !parts.headers.contains_key("mcp-session-id") => {
            format!("{STATELESS_OWNER}:{}", server.principal().id)
        }
        // A session's tasks are its own on every replica: named by its session id.
        Some(_) => {
            crate::server::http_session_scope(context).unwrap_or_else(|| server.scope().into())
        }
        None => server.scope().to_string(),
    }
}

fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|v| v.as_str() >= "2026-07-28")
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        other => {
            let mut m = Map::new();
            m.insert("value".into(), other);
            m
        }
    }
}

fn internal(message: impl Into<String>) -> JsonObject {
    object(json!({"code": -32603, "message": message.into()}))
}

/// One kernel round of a built-in job tool in the kernel scope `scope` (where the job lives):
/// the tool's structured answer, or why the kernel or the tool refused.
async fn mediated(
    server: &GatewayServer,
    scope: &str,
    tool: &str,
    args: Value,
) -> Result<Value, String> {
    let generation = server.gateway().generation();
    let session = generation.kernel.open_session(
        SessionConfig::new(scope.to_string())
            .principal(server.principal().clone())
            .authorizer(generation.gate.clone())
            .max_concurrent_tools(1),
    );
    let round = Round {
        calls: vec![ProposedCall {
            index: 0,
            call_id: format!(
                "mcp-task-{}",
                TASK_CALL_COUNTER.fetch_add(1, Ordering::Relaxed)
            ),
            tool: tool.into(),
            arguments: ProposedArguments::Value(args),
            idempotency_key: None,
        }],
        text: None,
    };
    // A task's own operation (a job's status, its result, its cancellation) is a round of
    // its own: its span is the parent of the round's stages.
    let span = tracing::info_span!(
        "ring0 task",
        otel.name = %format_args!("execute_tool {tool}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        ring0.principal = server.principal().id.as_str(),
    );
    let outcome =
        tracing::Instrument::instrument(session.run_round(round, &RoundOptions::default()), span)
            .await;
    match outcome.receipts.first().map(|r| &r.outcome) {
        Some(CallOutcome::Completed { observation }) if !observation.is_error => observation
            .structured
            .clone()
            .ok_or_else(|| format!("{tool} answered no status")),
        Some(CallOutcome::Completed { observation }) => Err(observation.text.clone()),
        Some(_) => Err(outcome
            .results
            .first()
            .map(|r| r.content.to_string())
            .unwrap_or_else(|| format!("{tool} was refused"))),
        None => Err(format!("{tool} produced no receipt")),
    }
}

fn bounded(mut text: String) -> String {
    if text.len() > TASK_STATUS_BYTES_MAX {
        let cut = text.ceil_char_boundary(text.len() - TASK_STATUS_BYTES_MAX);
        let dropped = cut;
        text = format!("[{dropped} earlier bytes not shown]\n{}", &text[cut..]);
    }
    text
}

/// The tool result of a finished job: its shaped output, and its status without it.
fn job_result(status: &Value, modern: bool) -> JsonObject {
    let state = status.get("state").and_then(Value::as_str).unwrap_or("");
    let observation = status.get("observation");
    let text = observation
        .and_then(|o| o.get("text"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let failed = observation
        .and_then(|o| o.get("is_error"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut summary = status.clone();
    if let Some(s) = summary.as_object_mut() {
        s.remove("observation");
        if let Some(o) = observation {
            for k in ["exit_code", "signal", "duration_ms"] {
                if let Some(v) = o.get(k) {
                    s.insert(k.into(), v.clone());
                }
            }
        }
    }
    let mut result = json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": summary,
        "isError": failed || state != "COMPLETED",
    });
    if let Some(job) = status.get("job") {
        result["_meta"] = json!({JOB_META_KEY: job});
    }
    object(adapt_to_era(result, RawKind::CallTool, modern))
}

fn settle_job(task: &TaskRecord, status: &Value) -> bool {
    let state = status.get("state").and_then(Value::as_str).unwrap_or("");
    if !matches!(state, "COMPLETED" | "FAILED" | "KILLED" | "TIMED_OUT") {
        return false;
    }
    let cancelled = task.lock().cancel_requested && state == "KILLED";
    if cancelled {
        task.finish(TaskStatus::Cancelled, None, None);
    } else {
        task.finish(
            TaskStatus::Completed,
            Some(job_result(status, task.modern)),
            None,
        );
    }
    true
}

/// Waits for a job task's job through the kernel until it finishes.
fn watch_job(server: GatewayServer, task: Arc<TaskRecord>, job: String, scope: String) {
    tokio::spawn(async move {
        loop {
            if task.lock().status.is_terminal() {
                return;
            }
            let wait = mediated(
                &server,
                &scope,
                "job_wait",
                json!({"job": job, "timeout_ms": TASK_JOB_WAIT_SLICE.as_millis() as u64}),
            )
            .await;
            match wait {
                Ok(status) => {
                    // A job killed because a client cancelled its task through another replica
                    // ends the task as cancelled here too.
                    if status.get("state").and_then(Value::as_str) == Some("KILLED")
                        && server.task_table().cancelled_elsewhere(&task.id).await
                    {
                        task.lock().cancel_requested = true;
                    }
                    if settle_job(&task, &status) {
                        return;
                    }
                }
                Err(why) => {
                    task.finish(TaskStatus::Failed, None, Some(internal(bounded(why))));
                    return;
                }
            }
        }
    });
}

fn create_result(task: &TaskRecord, job: Option<&str>) -> CallToolResponse {
    let mut created = CreateTaskResult::new(task.task());
    if let Some(job) = job
        && let Ok(meta) = serde_json::from_value(json!({JOB_META_KEY: job}))
    {
        created = created.with_meta(meta);
    }
    CallToolResponse::Task(created)
}

/// Answers a `tools/call` with a task where the client supports tasks and the call is one that
/// runs long (see the module documentation); `None` leaves the call to the ordinary path.
pub(crate) async fn offer(
    server: &GatewayServer,
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<Option<CallToolResponse>, ErrorData> {
    if !context
        .client_capabilities()
        .is_some_and(|c| c.supports_tasks())
    {
        return Ok(None);
    }
    let background_shell = request.name == "shell"
        && request
            .arguments
            .as_ref()
            .and_then(|a| a.get("background"))
            .and_then(Value::as_bool)
            == Some(true);
    let generation = server.gateway().generation();
    let upstream = generation
        .tools
        .get(request.name.as_ref())
        .is_some_and(|t| t.upstream.is_some());
    if !background_shell && !upstream {
        return Ok(None);
    }
    if background_shell {
        // A job task is followed and cancelled with the job tools: where the grants do not
        // allow them, the job handle is answered the ordinary way.
        let session = generation.kernel.open_session(
            SessionConfig::new(server.call_scope(request, context)?)
                .principal(server.principal().clone())
                .authorizer(generation.gate.clone()),
        );
        let catalog = session.catalog();
        let granted = |name: &str| catalog.iter().any(|spec| spec.name == name);
        if !JOB_TOOLS.iter().all(|t| granted(t)) {
            return Ok(None);
        }
    }
    let modern = is_modern(context);
    let table = server.task_table().clone();
    let Some(task) = table.create(&owner_of(server, context), modern) else {
        return Ok(None);
    };
    let mut ctx = context.clone();

    if background_shell {
        // The job lives in the scope its call ran in: its operations run there too.
        let scope = server.call_scope(request, context)?;
        let answer = match server.call(request.clone(), ctx).await {
            Ok(r) => r,
            Err(e) => {
                table.remove(&task.id);
                return Err(e);
            }
        };
        let job = Some(&answer.value)
            .filter(|v| v.get("isError").and_then(Value::as_bool) != Some(true))
            .and_then(|v| {
                v.pointer("/structuredContent/job")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            });
        let Some(job) = job else {
            // Refused, failed, not started, or waiting for an answer: the ordinary answer.
            table.remove(&task.id);
            return server.respond(answer, modern).map(Some);
        };
        {
            let mut s = task.lock();
            s.message = Some(format!("job {job} started"));
            s.work = Work::Job {
                job: job.clone(),
                scope: scope.clone(),
            };
        }
        // The job handle reaches the client in the task it is answered with.
        if let Some(d) = answer.delivery {
            d.delivered();
        }
        table.publish(&task, &job, &scope).await;
        watch_job(server.clone(), task.clone(), job.clone(), scope);
        return Ok(Some(create_result(&task, Some(&job))));
    }

    // An upstream call: answered directly if it finishes soon, otherwise a task, which
    // `tasks/cancel` stops upstream too.
    let cancel = CancellationToken::new();
    ctx.ct = cancel.clone();
    ctx.extensions.insert(StopOnCancel);
    let runner = server.clone();
    let call = request.clone();
    let mut handle = tokio::spawn(async move { runner.call(call, ctx).await });
    let early = tokio::select! {
        done = &mut handle => Some(done),
        _ = tokio::time::sleep(TASK_PROMOTE_AFTER) => None,
        _ = context.ct.cancelled() => {
            cancel.cancel();
            Some((&mut handle).await)
        }
    };
    if let Some(done) = early {
        table.remove(&task.id);
        return match done {
            Ok(r) => server.respond(r?, modern).map(Some),
            Err(e) => Err(ErrorData::internal_error(
                format!("the call failed: {e}"),
                None,
            )),
        };
    }
    {
        let mut s = task.lock();
        s.message = Some(format!("{} is running", request.name));
        s.work = Work::Call {
            cancel: cancel.clone(),
        };
    }
    let record = task.clone();
    tokio::spawn(async move {
        let done = handle.await;
        if record.lock().cancel_requested {
            record.finish(TaskStatus::Cancelled, None, None);
            return;
        }
        match done {
            Ok(Ok(answer))
                if answer.value.get("resultType").and_then(Value::as_str)
                    == Some("input_required") =>
            {
                record.finish(
                    TaskStatus::Failed,
                    None,
                    Some(internal("the call asked for input a task cannot carry")),
                )
            }
            Ok(Ok(answer)) => {
                record.lock().delivery = answer.delivery;
                record.finish(
                    TaskStatus::Completed,
                    Some(object(adapt_to_era(
                        answer.value,
                        RawKind::CallTool,
                        record.modern,
                    ))),
                    None,
                )
            }
            Ok(Err(e)) => record.finish(
                TaskStatus::Failed,
                None,
                serde_json::to_value(&e).ok().map(object),
            ),
            Err(e) => record.finish(
                TaskStatus::Failed,
                None,
                Some(internal(format!("the call failed: {e}"))),
            ),
        }
    });
    Ok(Some(create_result(&task, None)))
}

/// `tasks/get`.
pub(crate) async fn get(
    server: &GatewayServer,
    request: GetTaskParams,
    context: &RequestContext<RoleServer>,
) -> Result<GetTaskResult, ErrorData> {
    let task = server
        .task_table()
        .find_anywhere(&request.task_id, &owner_of(server, context))
        .await?;
    let job = {
        let mut s = task.lock();
        let fresh = s
            .inspected
            .is_some_and(|at| at.elapsed() < TASK_INSPECT_INTERVAL_MIN);
        match &s.work {
            Work::Job { job, scope } if !s.status.is_terminal() && !fresh => {
                let job = Some((job.clone(), scope.clone()));
                s.inspected = Some(Instant::now());
                job
            }
            _ => None,
        }
    };
    if let Some((job, scope)) = job {
        // The job's state and last lines of output, as `job_inspect` reports them.
        match mediated(
            server,
            &scope,
            "job_inspect",
            json!({"job": job, "tail_lines": 20}),
        )
        .await
        {
            Ok(snapshot) => {
                // Another replica's job is answered with its status alone (its shared record).
                let status = match snapshot.get("status") {
                    Some(status) => status.clone(),
                    None if snapshot.get("state").is_some() => snapshot.clone(),
                    None => Value::Null,
                };
                if !settle_job(&task, &status) {
                    let state = status.get("state").and_then(Value::as_str).unwrap_or("");
                    let tail = snapshot.get("tail").and_then(Value::as_str).unwrap_or("");
                    // A job blocked on its input is still working: the input goes in with
                    // job_send_input, a call of its own (the grants decide who may send it).
                    let waiting = if state == "SUSPENDED" {
                        format!(" (waiting for input: send it with job_send_input, job {job})")
                    } else {
                        String::new()
                    };
                    let mut s = task.lock();
                    s.message = Some(format!(
                        "job {job} {state}{waiting}; last output:\n{}",
                        bounded(tail.to_string())
                    ));
                    s.updated = SystemTime::now();
                }
            }
            Err(why) => {
                task.lock().message = Some(bounded(format!("job {job}: {why}")));
            }
        }
    }
    let detailed = task.detailed();
    if matches!(detailed.payload, TaskPayload::Completed { .. })
        && let Some(d) = task.lock().delivery.take()
    {
        // The result is handed to the client in this answer.
        d.delivered();
    }
    Ok(GetTaskResult::new(detailed))
}

/// `tasks/cancel`: stops the job or the call; the task reports `cancelled`.
pub(crate) async fn cancel(
    server: &GatewayServer,
    request: CancelTaskParams,
    context: &RequestContext<RoleServer>,
) -> Result<(), ErrorData> {
    let task = server
        .task_table()
        .find_anywhere(&request.task_id, &owner_of(server, context))
        .await?;
    let work = {
        let mut s = task.lock();
        if s.status.is_terminal() {
            return Ok(());
        }
        s.cancel_requested = true;
        match &s.work {
            Work::Job { job, scope } => Some((job.clone(), scope.clone())),
            Work::Call { cancel } => {
                cancel.cancel();
                None
            }
            Work::Pending => None,
        }
    };
    server.task_table().publish_cancel(&task.id).await;
    match work {
        Some((job, scope)) => {
            // `job_cancel` returns once the job's process tree is gone.
            match mediated(server, &scope, "job_cancel", json!({"job": job})).await {
                Ok(status) => {
                    if !settle_job(&task, &status) {
                        task.finish(TaskStatus::Cancelled, None, None);
                    }
                }
                Err(why) => {
                    return Err(ErrorData::internal_error(
                        format!("the job could not be cancelled: {}", bounded(why)),
                        None,
                    ));
                }
            }
        }
        None => task.finish(TaskStatus::Cancelled, None, None),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_unguessable_and_distinct() {
        let table = TaskTable::new();
        let a = table.create("s", false).unwrap();
        let b = table.create("s", false).unwrap();
        assert_ne!(a.id, b.id);
        // "task_" and 128 random bits in hex.
        assert_eq!(a.id.len(), 5 + 32);
    }

    #[test]
    fn another_sessions_task_is_answered_as_unknown() {
        let table = TaskTable::new();
        let task = table.create("session-a", false).unwrap();
        let foreign = table.find(&task.id, "session-b").err().unwrap();
        let unknown = table.find("task_nope", "session-b").err().unwrap();
        assert_eq!(foreign.code, unknown.code);
        assert!(table.find(&task.id, "session-a").is_ok());
    }

    #[test]
    fn at_the_session_bound_the_oldest_finished_task_makes_room() {
        let table = TaskTable::new();
        let tasks: Vec<_> = (0..TASKS_PER_SESSION_MAX)
            .map(|_| table.create("s", false).unwrap())
            .collect();
        // Nothing finished: no room, the call is answered the ordinary way.
        assert!(table.create("s", false).is_none());
        // Another session still has room.
        assert!(table.create("t", false).is_some());
        tasks[3].finish(TaskStatus::Cancelled, None, None);
        let fresh = table.create("s", false).unwrap();
        assert!(table.find(&tasks[3].id, "s").is_err());
        assert!(table.find(&fresh.id, "s").is_ok());
        assert!(table.find(&tasks[4].id, "s").is_ok());
    }

    #[test]
    fn the_whole_table_is_bounded() {
        let table = TaskTable::new();
        let mut made = 0;
        for i in 0..TASKS_MAX + 10 {
            if table.create(&format!("s{i}"), false).is_some() {
                made += 1;
            }
        }
        assert_eq!(made, TASKS_MAX);
        assert_eq!(table.len(), TASKS_MAX);
    }

    #[test]
    fn a_finished_job_reports_its_output_and_exit_status_for_its_era() {
        let status = json!({"job": "job_1", "state": "COMPLETED",
                            "observation": {"text": "hello\n", "exit_code": 0, "is_error": false}});
        let legacy = job_result(&status, false);
        assert_eq!(legacy["content"][0]["text"], "hello\n");
        assert_eq!(legacy["structuredContent"]["exit_code"], 0);
        assert_eq!(legacy["isError"], false);
        assert!(!legacy.contains_key("resultType"));
        assert_eq!(job_result(&status, true)["resultType"], "complete");
        let timed_out = json!({"job": "job_1", "state": "TIMED_OUT", "observation": {"text": ""}});
        assert_eq!(job_result(&timed_out, false)["isError"], true);
    }

    #[test]
    fn a_long_status_message_keeps_its_end_and_counts_the_rest() {
        let text = format!("{}END", "é".repeat(TASK_STATUS_BYTES_MAX));
        let out = bounded(text);
        assert!(out.ends_with("END"));
        assert!(out.starts_with('['), "{}", &out[..40]);
        assert!(out.len() < TASK_STATUS_BYTES_MAX + 64);
    }
}

/// Marks the request of an upstream call run as a task: cancelling it (`tasks/cancel`) stops
/// the dispatched call upstream rather than letting it finish for a retry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StopOnCancel;
