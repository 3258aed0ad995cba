//! Exceptions that carry ring0's error envelope: `status` (the kind), `message`, located
//! `errors` and `advice`, the shape of a refused call and of a refused `/v1` request. The
//! classes are defined in Python (`ring0.errors`); this module raises them.

use crate::convert::to_py;
use pyo3::prelude::*;
use serde_json::{Value, json};

/// An envelope: what was refused, where each problem is, what to do about it.
pub(crate) fn envelope(
    status: &str,
    message: impl Into<String>,
    errors: Vec<(String, String)>,
    advice: &str,
) -> Value {
    let errors: Vec<Value> = errors
        .into_iter()
        .map(|(loc, message)| json!({"loc": loc, "message": message}))
        .collect();
    json!({"status": status, "message": message.into(), "errors": errors, "advice": advice})
}

/// The exception of class `class` (in `ring0.errors`) carrying `envelope`.
pub(crate) fn raise(py: Python<'_>, class: &str, envelope: &Value) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let cls = py.import("ring0.errors")?.getattr(class)?;
        let obj = cls.call1((to_py(py, envelope)?,))?;
        Ok(PyErr::from_value(obj))
    })();
    made.unwrap_or_else(|e| e)
}

/// A configuration problem (a tool's declaration, a grant, the state directory), located.
pub(crate) fn config(py: Python<'_>, loc: impl Into<String>, message: impl Into<String>) -> PyErr {
    let message = message.into();
    raise(
        py,
        "ConfigError",
        &envelope(
            "validation_error",
            message.clone(),
            vec![(loc.into(), message)],
            "correct the fields named in errors",
        ),
    )
}
