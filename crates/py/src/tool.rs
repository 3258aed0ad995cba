//! Python functions as kernel tools, and Python callables awaited from the kernel.
//!
//! The kernel runs a tool only through [`ring0_kernel::Tool`], after preparation, admission,
//! planning and commit; a [`PyTool`] is that executor for a function decorated with
//! `@ring0.tool`. A plain function is called right where the kernel dispatches it, with the
//! interpreter attached; a coroutine function's coroutine is handed to an asyncio loop (the one
//! of the caller of `ahandle_turn`, or `ring0._bridge`'s background loop for a synchronous
//! caller) and awaited through a [`Done`] callback, so the kernel keeps running the turn's other
//! calls meanwhile.

use crate::convert::{to_json, to_py};
use async_trait::async_trait;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use ring0_core::Observation;
use ring0_kernel::{CallContext, Tool, ToolError};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// What the native side calls in Python (`ring0._bridge` and `ring0.errors`).
pub(crate) struct Bridge {
    /// `schedule(coroutine, loop_or_None, done)`: runs the coroutine on an asyncio loop and calls
    /// `done(future)` when it ends.
    pub schedule: Py<PyAny>,
    /// `jsonable(obj)`: a convertible form of an object the converter does not know.
    pub jsonable: Py<PyAny>,
    /// `ring0.errors.NotApplied`: a tool's failure that changed nothing.
    pub not_applied: Py<PyAny>,
}

impl Bridge {
    pub(crate) fn load(py: Python<'_>) -> PyResult<Self> {
        let bridge = py.import("ring0._bridge")?;
        let errors = py.import("ring0.errors")?;
        Ok(Self {
            schedule: bridge.getattr("schedule")?.unbind(),
            jsonable: bridge.getattr("jsonable")?.unbind(),
            not_applied: errors.getattr("NotApplied")?.unbind(),
        })
    }
}

/// The asyncio loop the round's coroutines run on (the caller's, for `ahandle_turn`), carried to
/// every call of the round in its extensions.
pub(crate) struct LoopRef(pub Py<PyAny>);

/// The outcome of an awaited Python callable: its value, or the exception it raised.
type Awaited = Result<Py<PyAny>, PyErr>;

/// `done(future)`: hands an asyncio future's outcome to the Rust side that awaits it.
#[pyclass(frozen)]
pub(crate) struct Done {
    tx: Mutex<Option<oneshot::Sender<Awaited>>>,
}

#[pymethods]
impl Done {
    fn __call__(&self, future: &Bound<'_, PyAny>) {
        let outcome = match future.call_method0("result") {
            Ok(value) => Ok(value.unbind()),
            Err(e) => Err(e),
        };
        if let Some(tx) = self.tx.lock().expect("done").take() {
            let _ = tx.send(outcome);
        }
    }
}

/// What a Python callable gave: a value now, or a coroutine scheduled to finish later.
pub(crate) enum Called {
    Now(Py<PyAny>),
    Later(oneshot::Receiver<Awaited>),
}

/// Schedules `coroutine` on `event_loop` (or the background loop) and returns how to await it.
pub(crate) fn schedule(
    py: Python<'_>,
    bridge: &Bridge,
    coroutine: Bound<'_, PyAny>,
    event_loop: Option<&LoopRef>,
) -> PyResult<oneshot::Receiver<Awaited>> {
    let (tx, rx) = oneshot::channel();
    let done = Py::new(
        py,
        Done {
            tx: Mutex::new(Some(tx)),
        },
    )?;
    let lp = match event_loop {
        Some(l) => l.0.clone_ref(py).into_bound(py),
        None => py.None().into_bound(py),
    };
    bridge.schedule.bind(py).call1((coroutine, lp, done))?;
    Ok(rx)
}

/// Awaits what [`Called`] holds.
pub(crate) async fn finish(called: Called) -> Awaited {
    match called {
        Called::Now(v) => Ok(v),
        Called::Later(rx) => rx.await.unwrap_or_else(|_| {
            Err(pyo3::exceptions::PyRuntimeError::new_err(
                "the asyncio loop ended before the coroutine finished",
            ))
        }),
    }
}

/// A function decorated with `@ring0.tool`, run by the kernel.
pub(crate) struct PyTool {
    pub func: Py<PyAny>,
    /// A coroutine function: its call returns a coroutine to schedule.
    pub is_async: bool,
    /// Called with the arguments dict (the decorator's wrapper converts them) instead of as
    /// keywords.
    pub takes_dict: bool,
    /// The keyword the call's context is passed under, if the function takes it.
    pub context_param: Option<String>,
    pub bridge: Arc<Bridge>,
}

impl PyTool {
    fn start(&self, py: Python<'_>, ctx: &CallContext, args: &Value) -> PyResult<Called> {
        let kwargs = match args {
            Value::Object(map) => crate::convert::dict(py, map)?,
            _ => PyDict::new(py),
        };
        if let Some(name) = &self.context_param {
            kwargs.set_item(PyString::new(py, name), context(py, ctx)?)?;
        }
        let func = self.func.bind(py);
        let value = if self.takes_dict {
            func.call1((kwargs,))?
        } else {
            func.call((), Some(&kwargs))?
        };
        if self.is_async {
            let event_loop = ctx.extensions.get::<LoopRef>();
            Ok(Called::Later(schedule(
                py,
                &self.bridge,
                value,
                event_loop.as_deref(),
            )?))
        } else {
            Ok(Called::Now(value.unbind()))
        }
    }

    fn failure(&self, py: Python<'_>, err: PyErr) -> ToolError {
        let text = describe(py, &err);
        if err.is_instance(py, self.bridge.not_applied.bind(py)) {
            ToolError::not_applied(text)
        } else {
            ToolError::unknown(text)
        }
    }
}

/// `ValueError: the message`, or the message alone for ring0's own failures.
fn describe(py: Python<'_>, err: &PyErr) -> String {
    let value = err.value(py);
    let message = value
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "(unprintable exception)".into());
    let name = value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    if name == "NotApplied" || name.is_empty() {
        message
    } else {
        format!("{name}: {message}")
    }
}

/// The call's context as a Python dict.
fn context<'py>(py: Python<'py>, ctx: &CallContext) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("call_id", &ctx.call_id)?;
    d.set_item("intent_id", ctx.intent_id.as_deref())?;
    d.set_item("idempotency_key", ctx.idempotency_key.as_deref())?;
    d.set_item("scope", &*ctx.scope)?;
    d.set_item("session_id", &ctx.session.session_id)?;
    d.set_item("principal", &ctx.session.principal.id)?;
    d.set_item("timeout_ms", ctx.timeout_ms)?;
    Ok(d)
}

/// A tool's return value as the kernel's observation: text as text, anything else as JSON.
fn observation(py: Python<'_>, bridge: &Bridge, value: &Bound<'_, PyAny>) -> PyResult<Observation> {
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Observation::text(s.to_str()?));
    }
    Ok(Observation::json(to_json(value, bridge.jsonable.bind(py))?))
}

// `Tool::call` returns the kernel's `ToolError` as it is; boxing it here would only unbox it.
#[allow(clippy::result_large_err)]
#[async_trait]
impl Tool for PyTool {
    async fn call(&self, ctx: CallContext, args: Value) -> Result<Observation, ToolError> {
        // A plain function's value is read while the interpreter is still held.
        let called = Python::attach(|py| match self.start(py, &ctx, &args) {
            Ok(Called::Now(value)) => Err(self.read(py, Ok(value))),
            Ok(later) => Ok(later),
            Err(e) => Err(Err(self.failure(py, e))),
        });
        let later = match called {
            Ok(later) => later,
            Err(done) => return done,
        };
        let awaited = tokio::select! {
            done = finish(later) => done,
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::unknown(
                    "the call was stopped while its coroutine ran; its outcome is unknown",
                ));
            }
        };
        Python::attach(|py| self.read(py, awaited))
    }
}

impl PyTool {
    /// What the function gave, as the kernel settles it.
    #[allow(clippy::result_large_err)]
    fn read(&self, py: Python<'_>, awaited: Awaited) -> Result<Observation, ToolError> {
        match awaited {
            Ok(value) => observation(py, &self.bridge, value.bind(py)).map_err(|e| {
                ToolError::unknown(format!(
                    "the tool ran, but its result could not be read: {}",
                    describe(py, &e)
                ))
            }),
            Err(e) => Err(self.failure(py, e)),
        }
    }
}

/// Calls a Python callable that may be a coroutine function (an approver): its value, awaited.
pub(crate) async fn call_maybe_async(
    bridge: &Bridge,
    func: &Py<PyAny>,
    arg: &Value,
    event_loop: Option<&LoopRef>,
) -> Awaited {
    let called = Python::attach(|py| -> PyResult<Called> {
        let value = func.bind(py).call1((to_py(py, arg)?,))?;
        let is_coroutine = py
            .import("inspect")?
            .getattr("isawaitable")?
            .call1((&value,))?
            .is_truthy()?;
        if is_coroutine {
            Ok(Called::Later(schedule(py, bridge, value, event_loop)?))
        } else {
            Ok(Called::Now(value.unbind()))
        }
    });
    match called {
        Ok(c) => finish(c).await,
        Err(e) => Err(e),
    }
}
