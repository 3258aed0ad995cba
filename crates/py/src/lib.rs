//! `ring0._ring0`: ring0's mediation kernel inside a Python process.
//!
//! The pure-Python package `ring0` (in `python/ring0/`) wraps these classes; they are not meant
//! to be used directly. A [`NativeKernel`] holds the tools (functions decorated with
//! `@ring0.tool`, declared as `ring0-host` host tools), the SQLite journal in a state directory,
//! the grants (a `ring0-policy` policy) and the approval channel; a [`NativeSession`] hands it
//! model turns in a provider format and returns the tool-result message(s) in the same format.
//! Every call goes through the whole pipeline: validated against its closed schema (errors the
//! model can correct come back as its result), authorized, ordered, committed to the journal
//! before a mutating call runs, run, settled, shaped and projected.
//!
//! Turns run on a current-thread runtime driven by the calling thread, with the interpreter
//! released; a Python tool is called on that thread when the kernel dispatches it, so a call
//! costs no thread hand-off.

mod approve;
mod convert;
mod errors;
mod tool;

use crate::approve::{Approvals, Mode, PyApprover};
use crate::convert::{to_json, to_py};
use crate::tool::{Bridge, LoopRef, PyTool};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use ring0_core::format::{parse_turn, render_results};
use ring0_core::{Authority, Principal, ProviderFormat, Settlement};
use ring0_host::{AuthorityLevel, ExecutionMode, HostTool, TurnFormat};
use ring0_journal::SqliteJournal;
use ring0_kernel::{CallExtensions, Kernel, RoundOptions, SessionConfig};
use ring0_policy::{ApprovalScope, Grant, JsonlAudit, Policy, RateLimit};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The journal, in the state directory (the same name `ring0`'s own state directory uses, so
/// `ring0 journal ls --state-dir DIR` reads it).
const JOURNAL_FILE: &str = "journal.db";
/// The hash-chained audit log of every authorization decision, in the state directory.
const AUDIT_FILE: &str = "audit.jsonl";
/// Longest approval timeout accepted.
const APPROVAL_TIMEOUT_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// The audit log, as much of it as the host asked for: every decision but the allowed calls of
/// read-only tools (`"writes"`, the default), or every decision (`"all"`).
struct AuditFilter {
    log: JsonlAudit,
    /// Tools whose allowed calls are not written (the read-only ones), for `"writes"`.
    quiet: std::collections::BTreeSet<String>,
}

impl ring0_policy::AuditSink for AuditFilter {
    fn record(&self, entry: &ring0_policy::AuditEntry) -> Result<(), String> {
        if entry.decision == ring0_policy::AuditDecision::Allowed
            && self.quiet.contains(&entry.tool)
        {
            return Ok(());
        }
        self.log.record(entry)
    }
}

/// What a kernel's sessions share.
struct Shared {
    kernel: Kernel,
    bridge: Arc<Bridge>,
    /// Always `Some` until the kernel is dropped.
    runtime: Option<tokio::runtime::Runtime>,
    approvals: Arc<Approvals>,
    state_dir: PathBuf,
}

impl Shared {
    /// Runs `future` to its end on the kernel's runtime, with the interpreter released.
    fn block_on<F: std::future::Future + Send>(
        &self,
        py: Python<'_>,
        future: F,
    ) -> PyResult<F::Output>
    where
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(PyRuntimeError::new_err(
                "ring0 was called from inside one of its own calls (a tool or an approver); \
                 a tool cannot hand a turn to ring0",
            ));
        }
        let runtime = self
            .runtime
            .as_ref()
            .expect("the runtime lives as long as the kernel");
        Ok(py.detach(|| runtime.block_on(future)))
    }
}

impl Drop for Shared {
    /// The last reference to a kernel may go while another kernel's turn runs (Python's
    /// garbage collector runs wherever it runs, a tool included), where a runtime may not block
    /// to shut down: there it is shut down on a thread of its own.
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = std::thread::Builder::new()
                .name("ring0-drop".into())
                .spawn(move || drop(runtime));
        }
    }
}

/// One grant, as Python gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantDef {
    #[serde(default)]
    name: Option<String>,
    tools: Vec<String>,
    ceiling: AuthorityLevel,
    #[serde(default)]
    approval: bool,
    #[serde(default)]
    approval_scope: Option<String>,
    #[serde(default)]
    rules: Vec<String>,
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    unattended: bool,
    #[serde(default)]
    principals: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

fn grant(py: Python<'_>, i: usize, def: GrantDef) -> PyResult<Grant> {
    let loc = format!("/grants/{i}");
    let tools: Vec<&str> = def.tools.iter().map(String::as_str).collect();
    let name = def.name.unwrap_or_else(|| format!("grant{i}"));
    let mut g = Grant::new(name, &tools, def.ceiling.core())
        .approval(def.approval)
        .unattended(def.unattended)
        .principals(def.principals)
        .groups(def.groups);
    if let Some(scope) = &def.approval_scope {
        g = g.approval_scope(
            ApprovalScope::parse(scope)
                .map_err(|e| errors::config(py, format!("{loc}/approval_scope"), e))?,
        );
    }
    for (j, rule) in def.rules.iter().enumerate() {
        g = g
            .rule(rule)
            .map_err(|e| errors::config(py, format!("{loc}/rules/{j}"), e.to_string()))?;
    }
    if let Some(rate) = &def.rate {
        g = g.rate(
            RateLimit::parse(rate)
                .map_err(|e| errors::config(py, format!("{loc}/rate"), e.to_string()))?,
        );
    }
    g.validate().map_err(|e| errors::config(py, loc, e))?;
    Ok(g)
}

/// The grants when the host names none: each tool up to A3 under a grant of its own, held for
/// a person's approval when it acts outside (A2) without a way to settle an unknown outcome,
/// and always at A3 (the policy holds every A3 call).
fn default_grants(specs: &[ring0_core::ToolSpec]) -> Vec<Grant> {
    specs
        .iter()
        .map(|s| {
            let unsettled = s.authority >= Authority::A1 && s.settlement == Settlement::None;
            Grant::new(
                format!("default:{}", s.name),
                &[s.name.as_str()],
                Authority::A3,
            )
            .approval(unsettled && !s.effect.is_read_only())
        })
        .collect()
}

/// The kernel: tools, journal, grants and approvals. `ring0.Kernel` wraps it.
#[pyclass(frozen, module = "ring0._ring0")]
struct NativeKernel {
    shared: Arc<Shared>,
}

/// One tool as the Python side declares it: its `HostTool` declaration (JSON), the function,
/// whether it is a coroutine function, whether it takes the arguments as one dict, and the
/// keyword its call context goes under.
type ToolEntry = (String, Py<PyAny>, bool, bool, Option<String>);

#[pymethods]
impl NativeKernel {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (state_dir, tools, grants=None, approvals="hold", approver=None, approval_timeout_ms=300_000, audit="writes"))]
    fn new(
        py: Python<'_>,
        state_dir: PathBuf,
        tools: Vec<ToolEntry>,
        grants: Option<String>,
        approvals: &str,
        approver: Option<Py<PyAny>>,
        approval_timeout_ms: u64,
        audit: &str,
    ) -> PyResult<Self> {
        let bridge = Arc::new(Bridge::load(py)?);
        let mut specs = Vec::with_capacity(tools.len());
        let mut executors = Vec::with_capacity(tools.len());
        for (i, (declaration, func, is_async, takes_dict, context_param)) in
            tools.into_iter().enumerate()
        {
            let def: HostTool = serde_json::from_str(&declaration)
                .map_err(|e| errors::config(py, format!("/tools/{i}"), e.to_string()))?;
            let spec = ring0_host::tool_spec(&def)
                .map_err(|p| errors::config(py, format!("/tools/{i}{}", p.loc), p.message))?;
            if specs
                .iter()
                .any(|s: &ring0_core::ToolSpec| s.name == spec.name)
            {
                return Err(errors::config(
                    py,
                    format!("/tools/{i}/name"),
                    format!("tool {:?} is defined twice", spec.name),
                ));
            }
            specs.push(spec);
            executors.push(Arc::new(PyTool {
                func,
                is_async,
                takes_dict,
                context_param,
                bridge: bridge.clone(),
            }));
        }
        let mode = match (approvals, approver) {
            (_, Some(callback)) => Mode::Callback(callback),
            ("hold", None) => Mode::Hold,
            ("wait", None) => Mode::Wait,
            (other, None) => {
                return Err(errors::config(
                    py,
                    "/approvals",
                    format!("{other:?}: write \"hold\" or \"wait\", or give an approver"),
                ));
            }
        };
        if approval_timeout_ms == 0 || approval_timeout_ms > APPROVAL_TIMEOUT_MS_MAX {
            return Err(errors::config(
                py,
                "/approval_timeout",
                format!(
                    "the approval timeout must be within 1 ms..=24 h, not {approval_timeout_ms} ms"
                ),
            ));
        }
        let approvals = Arc::new(Approvals::new(mode, bridge.clone()));
        let grants = match grants {
            None => default_grants(&specs),
            Some(text) => {
                let defs: Vec<GrantDef> = serde_json::from_str(&text)
                    .map_err(|e| errors::config(py, "/grants", e.to_string()))?;
                defs.into_iter()
                    .enumerate()
                    .map(|(i, d)| grant(py, i, d))
                    .collect::<PyResult<_>>()?
            }
        };
        std::fs::create_dir_all(&state_dir).map_err(|e| {
            errors::config(py, "/state_dir", format!("{}: {e}", state_dir.display()))
        })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700));
        }
        let mut policy = Policy::builder()
            .approver(Arc::new(PyApprover(approvals.clone())))
            .approval_timeout(Duration::from_millis(approval_timeout_ms));
        for g in grants {
            policy = policy
                .grant(g)
                .map_err(|e| errors::config(py, "/grants", e))?;
        }
        let quiet = match audit {
            "off" => None,
            "all" => Some(Default::default()),
            "writes" => Some(
                specs
                    .iter()
                    .filter(|s| s.effect.is_read_only())
                    .map(|s| s.name.clone())
                    .collect(),
            ),
            other => {
                return Err(errors::config(
                    py,
                    "/audit",
                    format!("{other:?}: write \"writes\", \"all\" or \"off\""),
                ));
            }
        };
        if let Some(quiet) = quiet {
            let path = state_dir.join(AUDIT_FILE);
            let log = JsonlAudit::open(&path).map_err(|e| {
                errors::config(py, "/state_dir", format!("{}: {e}", path.display()))
            })?;
            policy = policy.audit(Arc::new(AuditFilter { log, quiet }));
        }
        let journal_path = state_dir.join(JOURNAL_FILE);
        let journal = py
            .detach(|| SqliteJournal::open(&journal_path))
            .map_err(|e| {
                errors::config(
                    py,
                    "/state_dir",
                    format!("journal {}: {e}", journal_path.display()),
                )
            })?;
        let mut builder = Kernel::builder()
            .journal(Arc::new(journal))
            .authorizer(Arc::new(policy.build()));
        for (spec, executor) in specs.into_iter().zip(executors) {
            builder = builder
                .tool(spec, executor)
                .map_err(|refused| errors::config(py, "/tools", refused.error.to_string()))?;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("starting the runtime: {e}")))?;
        let shared = Arc::new(Shared {
            kernel: builder.build(),
            bridge,
            runtime: Some(runtime),
            approvals,
            state_dir,
        });
        // What an earlier process left open in the journal is settled before anything new
        // runs: calls in flight at a crash are reconciled, never re-sent blindly.
        let recovered = shared.block_on(py, shared.kernel.recover())?;
        recovered.map_err(|e| {
            errors::raise(
                py,
                "JournalError",
                &errors::envelope(
                    "journal_error",
                    format!("recovering the journal: {e}"),
                    vec![],
                    "inspect it with `ring0 journal ls --state-dir DIR`",
                ),
            )
        })?;
        Ok(Self { shared })
    }

    /// Opens a session.
    #[pyo3(signature = (scope, mode="safe_parallel", principal=None, session_id=None, attempt_epoch=0, keyed=true, max_concurrent_tools=None))]
    #[allow(clippy::too_many_arguments)]
    fn session(
        &self,
        py: Python<'_>,
        scope: String,
        mode: &str,
        principal: Option<String>,
        session_id: Option<String>,
        attempt_epoch: u64,
        keyed: bool,
        max_concurrent_tools: Option<usize>,
    ) -> PyResult<NativeSession> {
        let mode: ExecutionMode =
            serde_json::from_value(Value::String(mode.into())).map_err(|_| {
                errors::config(
                    py,
                    "/mode",
                    format!("{mode:?}: write sequential, safe_parallel or parallel"),
                )
            })?;
        if scope.is_empty() || scope.len() > 256 {
            return Err(errors::config(py, "/scope", "a scope is 1 to 256 bytes"));
        }
        let mut config = SessionConfig::new(&scope)
            .mode(mode.scheduling())
            .attempt_epoch(attempt_epoch)
            .principal(principal.map_or_else(Principal::local, Principal::new));
        if let Some(id) = session_id {
            config = config.session_id(id);
        }
        if let Some(n) = max_concurrent_tools {
            config = config.max_concurrent_tools(n);
        }
        Ok(NativeSession {
            session: self.shared.kernel.open_session(config),
            shared: self.shared.clone(),
            scope,
            keyed,
        })
    }

    /// The calls held for a person now, of every session.
    fn pending_approvals(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        pending(py, &self.shared, None)
    }

    /// Decides a held call: approve it (`remember`: identical calls of the session too, where
    /// the grant offers it) or deny it.
    #[pyo3(signature = (approval_id, approve, remember=false, reason=""))]
    fn decide(
        &self,
        py: Python<'_>,
        approval_id: &str,
        approve: bool,
        remember: bool,
        reason: &str,
    ) -> PyResult<()> {
        decide(py, &self.shared, approval_id, approve, remember, reason)
    }

    /// The state directory.
    #[getter]
    fn state_dir(&self) -> PathBuf {
        self.shared.state_dir.clone()
    }

    /// Every tool's spec as the kernel registered it.
    fn tools(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let specs: Vec<Value> = self
            .shared
            .kernel
            .registry()
            .iter()
            .map(|t| serde_json::to_value(&t.spec).unwrap_or(Value::Null))
            .collect();
        Ok(to_py(py, &Value::Array(specs))?.unbind())
    }
}

fn pending(py: Python<'_>, shared: &Shared, session: Option<&str>) -> PyResult<Py<PyAny>> {
    let requests = shared.approvals.pending(session);
    let value = serde_json::to_value(&requests).unwrap_or(Value::Null);
    Ok(to_py(py, &value)?.unbind())
}

fn decide(
    py: Python<'_>,
    shared: &Shared,
    approval_id: &str,
    approve: bool,
    remember: bool,
    reason: &str,
) -> PyResult<()> {
    if shared
        .approvals
        .decide(approval_id, approve, remember, reason)
    {
        return Ok(());
    }
    Err(errors::raise(
        py,
        "NotFound",
        &errors::envelope(
            "not_found",
            format!("no call is held for approval {approval_id:?}"),
            vec![("/approval_id".into(), "not held".into())],
            "read pending_approvals() for the held calls",
        ),
    ))
}

/// The idempotency key a call of the session is journaled under when the session is keyed: one
/// per (scope, provider call id), so the same model turn handed over again — a re-run of the
/// same step — is answered from the journal instead of run again.
fn call_key(scope: &str, call_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"ring0-py-call\0");
    h.update(scope.as_bytes());
    h.update([0]);
    h.update(call_id.as_bytes());
    let digest = h.finalize();
    let mut out = String::with_capacity(44);
    out.push_str("py1-");
    for b in &digest[..20] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// One agent run over the kernel. `ring0.Session` wraps it.
#[pyclass(frozen, module = "ring0._ring0")]
struct NativeSession {
    shared: Arc<Shared>,
    session: ring0_kernel::Session,
    scope: String,
    keyed: bool,
}

fn invalid_turn(py: Python<'_>, loc: &str, why: String) -> PyErr {
    errors::raise(
        py,
        "InvalidTurn",
        &errors::envelope(
            "invalid_turn",
            why.clone(),
            vec![(loc.to_string(), why)],
            "send the model's message or output items as the provider returned them",
        ),
    )
}

#[pymethods]
impl NativeSession {
    /// Mediates one model turn and returns the tool-result message(s) in its format (with
    /// `detailed`, a dict of the message, each call's result, `terminated` and
    /// `policy_message`).
    #[pyo3(signature = (format, message, event_loop=None, detailed=false))]
    fn handle_turn(
        &self,
        py: Python<'_>,
        format: &str,
        message: &Bound<'_, PyAny>,
        event_loop: Option<Py<PyAny>>,
        detailed: bool,
    ) -> PyResult<Py<PyAny>> {
        let Some(format) = TurnFormat::parse(format) else {
            return Err(invalid_turn(
                py,
                "/format",
                format!("{format:?}: write openai, responses or anthropic"),
            ));
        };
        let provider: ProviderFormat = format.provider();
        let turn: Value = match message.cast::<PyString>() {
            Ok(text) => serde_json::from_str(text.to_str()?)
                .map_err(|e| invalid_turn(py, "", format!("the message is not JSON: {e}")))?,
            Err(_) => {
                let jsonable = self.shared.bridge.jsonable.bind(py);
                to_json(message, jsonable).map_err(|e| {
                    invalid_turn(py, "", format!("the message is not JSON: {}", e.value(py)))
                })?
            }
        };
        let mut round =
            parse_turn(provider, &turn).map_err(|e| invalid_turn(py, &e.path, e.why))?;
        if self.keyed {
            for call in &mut round.calls {
                if call.idempotency_key.is_none() {
                    call.idempotency_key = Some(call_key(&self.scope, &call.call_id));
                }
            }
        }
        let mut options = RoundOptions::default();
        if let Some(lp) = event_loop {
            options.extensions = CallExtensions::new().with(LoopRef(lp));
        }
        let outcome = self
            .shared
            .block_on(py, self.session.run_round(round, &options))?;
        let rendered = render_results(provider, &outcome.results);
        let value = if detailed {
            json!({
                "message": rendered,
                "results": outcome.results,
                "terminated": outcome.terminated,
                "policy_message": outcome.policy_message,
                "receipts": outcome.receipts,
            })
        } else {
            rendered
        };
        let out = to_py(py, &value)?.unbind();
        // The results are in the caller's hands now.
        outcome.delivered();
        Ok(out)
    }

    /// A new subscription to the session's events, from now on.
    fn events(&self) -> NativeEvents {
        NativeEvents {
            shared: self.shared.clone(),
            rx: Mutex::new(self.session.subscribe()),
        }
    }

    /// The calls of this session held for a person now.
    fn pending_approvals(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        pending(py, &self.shared, Some(&self.session.info().session_id))
    }

    /// Decides a held call of this session.
    #[pyo3(signature = (approval_id, approve, remember=false, reason=""))]
    fn decide(
        &self,
        py: Python<'_>,
        approval_id: &str,
        approve: bool,
        remember: bool,
        reason: &str,
    ) -> PyResult<()> {
        let mine = self
            .shared
            .approvals
            .pending(Some(&self.session.info().session_id))
            .iter()
            .any(|r| r.id == approval_id);
        if !mine {
            return Err(errors::raise(
                py,
                "NotFound",
                &errors::envelope(
                    "not_found",
                    format!("no call of this session is held for approval {approval_id:?}"),
                    vec![("/approval_id".into(), "not held".into())],
                    "read pending_approvals() for the held calls",
                ),
            ));
        }
        decide(py, &self.shared, approval_id, approve, remember, reason)
    }

    /// Cancels the turn in progress: running calls settle, nothing new starts.
    fn cancel(&self) {
        self.session.cancel();
    }

    /// A genuine new user message: lifts a repeat-guard termination.
    fn user_message(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.block_on(py, self.session.user_message())
    }

    /// The tools this session may call, as the model should see them.
    fn catalog(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let list = PyList::empty(py);
        for spec in self.session.catalog() {
            let v = json!({"name": spec.name, "description": spec.description,
                           "input_schema": spec.input_schema});
            list.append(to_py(py, &v)?)?;
        }
        Ok(list.into_any().unbind())
    }

    /// Scope, session id and principal.
    #[getter]
    fn info(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let info = self.session.info();
        let v = json!({"scope": info.scope, "session_id": info.session_id,
                       "principal": info.principal.id});
        Ok(to_py(py, &v)?.unbind())
    }
}

/// A subscription to a session's events. `ring0.Events` wraps it.
#[pyclass(frozen, module = "ring0._ring0")]
struct NativeEvents {
    shared: Arc<Shared>,
    rx: Mutex<tokio::sync::broadcast::Receiver<ring0_kernel::Event>>,
}

fn event_value(
    received: Result<ring0_kernel::Event, tokio::sync::broadcast::error::RecvError>,
) -> Option<Value> {
    use tokio::sync::broadcast::error::RecvError;
    match received {
        Ok(event) => serde_json::to_value(&event).ok(),
        Err(RecvError::Lagged(missed)) => Some(json!({"event": "lagged", "missed": missed})),
        Err(RecvError::Closed) => None,
    }
}

#[pymethods]
impl NativeEvents {
    /// The next event already sent, or `None`.
    fn try_next(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        use tokio::sync::broadcast::error::TryRecvError;
        let got = self.rx.lock().expect("events").try_recv();
        let value = match got {
            Ok(event) => serde_json::to_value(&event).ok(),
            Err(TryRecvError::Lagged(missed)) => Some(json!({"event": "lagged", "missed": missed})),
            Err(TryRecvError::Empty | TryRecvError::Closed) => None,
        };
        value.map(|v| Ok(to_py(py, &v)?.unbind())).transpose()
    }

    /// The next event, waiting at most `timeout` seconds (forever without one); `None` when none
    /// came.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        let limit = match timeout {
            Some(t) if !(t.is_finite() && t >= 0.0) => {
                return Err(PyValueError::new_err(
                    "timeout is a number of seconds, 0 or more",
                ));
            }
            Some(t) => Some(Duration::from_secs_f64(t)),
            None => None,
        };
        let value = self.shared.block_on(py, async {
            let mut rx = self.rx.lock().expect("events").resubscribe_keep();
            let recv = rx.recv();
            let got = match limit {
                Some(d) => tokio::time::timeout(d, recv).await.ok(),
                None => Some(recv.await),
            };
            let value = got.and_then(event_value);
            *self.rx.lock().expect("events") = rx;
            value
        })?;
        value.map(|v| Ok(to_py(py, &v)?.unbind())).transpose()
    }
}

/// Takes a receiver out of its mutex for an await, leaving a fresh one in its place until it is
/// put back (the lock is never held across the await).
trait Keep {
    fn resubscribe_keep(&mut self) -> Self;
}

impl<T: Clone> Keep for tokio::sync::broadcast::Receiver<T> {
    fn resubscribe_keep(&mut self) -> Self {
        let fresh = self.resubscribe();
        std::mem::replace(self, fresh)
    }
}

#[pymodule]
fn _ring0(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeKernel>()?;
    m.add_class::<NativeSession>()?;
    m.add_class::<NativeEvents>()?;
    m.add_class::<tool::Done>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
