//! JSON values to Python objects and back, without a serializer in between.
//!
//! Python to JSON takes `None`, `bool`, `int` (within 64 bits), finite `float`, `str`, and
//! `dict` (string keys), `list` and `tuple` of those; anything else (a pydantic model, a
//! dataclass, an enum member, a set) is handed to `ring0._bridge.jsonable` first, which turns it
//! into one of those or says why it cannot.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// Deepest nesting converted: deeper values are refused rather than exhausting the stack.
const DEPTH_MAX: usize = 128;

/// A Python object as JSON; `jsonable` turns other objects into convertible ones.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>, jsonable: &Bound<'_, PyAny>) -> PyResult<Value> {
    convert(obj, jsonable, 0, true)
}

fn convert(
    obj: &Bound<'_, PyAny>,
    jsonable: &Bound<'_, PyAny>,
    depth: usize,
    helped: bool,
) -> PyResult<Value> {
    if depth > DEPTH_MAX {
        return Err(PyValueError::new_err(format!(
            "the value nests deeper than {DEPTH_MAX} levels"
        )));
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            return Ok(Value::from(v));
        }
        if let Ok(v) = i.extract::<u64>() {
            return Ok(Value::from(v));
        }
        return Err(PyValueError::new_err(
            "an integer beyond 64 bits cannot be sent as JSON",
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err("NaN and infinities are not JSON"));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::with_capacity(d.len());
        for (k, v) in d.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => s.to_str()?.to_owned(),
                Err(_) => k.str()?.to_str()?.to_owned(),
            };
            map.insert(key, convert(&v, jsonable, depth + 1, true)?);
        }
        return Ok(Value::Object(map));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        let mut out = Vec::with_capacity(l.len());
        for v in l.iter() {
            out.push(convert(&v, jsonable, depth + 1, true)?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let mut out = Vec::with_capacity(t.len());
        for v in t.iter() {
            out.push(convert(&v, jsonable, depth + 1, true)?);
        }
        return Ok(Value::Array(out));
    }
    if !helped {
        return Err(PyValueError::new_err(format!(
            "a {} cannot be sent as JSON",
            obj.get_type().name()?
        )));
    }
    let plain = jsonable.call1((obj,))?;
    convert(&plain, jsonable, depth + 1, false)
}

/// A JSON value as a Python object.
pub(crate) fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => dict(py, map)?.into_any(),
    })
}

/// A JSON object as a Python dict.
pub(crate) fn dict<'py>(py: Python<'py>, map: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in map {
        d.set_item(k, to_py(py, v)?)?;
    }
    Ok(d)
}
