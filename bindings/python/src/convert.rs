//! Conversions between Python values and core types, and core errors to exceptions.

use crate::{Decision, Lease, Limit, Policy};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};
use shardlimit::Error as CoreError;
use std::time::Duration;

static FROM_CORE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static RATE_LIMIT_EXCEEDED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn errors_attr<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyAny>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyAny>> {
    cell.get_or_try_init(py, || {
        Ok(py.import("shardlimit._errors")?.getattr(name)?.unbind())
    })
    .map(|f| f.bind(py))
}

/// The exception of `shardlimit._errors` for a core error: one class per [`shardlimit::ErrorKind`],
/// carrying the core's message, `kind` and `code`.
pub fn core_err(e: CoreError) -> PyErr {
    Python::attach(|py| {
        let kind = e.kind();
        let make = || -> PyResult<PyErr> {
            let f = errors_attr(py, &FROM_CORE, "_from_core")?;
            let exc = f.call1((kind.name(), kind.code(), e.to_string()))?;
            Ok(PyErr::from_value(exc))
        };
        make().unwrap_or_else(|import_failure| {
            let err = PyRuntimeError::new_err(format!("{kind}: {e}"));
            err.set_cause(py, Some(import_failure));
            err
        })
    })
}

/// `shardlimit.RateLimitExceeded(decision)`: a lease context was denied.
pub fn rate_limit_exceeded(py: Python<'_>, d: shardlimit::Decision) -> PyErr {
    let make = || -> PyResult<PyErr> {
        let cls = errors_attr(py, &RATE_LIMIT_EXCEEDED, "RateLimitExceeded")?;
        Ok(PyErr::from_value(cls.call1((Decision(d),))?))
    };
    make().unwrap_or_else(|e| e)
}

fn invalid(what: &str, message: impl Into<String>) -> PyErr {
    core_err(CoreError::InvalidArgument {
        what: what.to_string(),
        message: message.into(),
    })
}

/// A cost or a number of units: a Python int, default 1. Negative or huge ints are an
/// InvalidArgumentError (like the core's zero), anything but an int a TypeError.
pub fn cost_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let Some(v) = v else { return Ok(1) };
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "cost must be an int, not {}",
            v.get_type().name()?
        )));
    }
    v.extract::<u64>().map_err(|_| {
        if v.lt(0).unwrap_or(false) {
            invalid("cost", format!("must be at least 1, got {v}"))
        } else {
            invalid("cost", format!("must be at most {}, got {v}", u64::MAX))
        }
    })
}

/// Seconds (a float) to a Duration, to the microsecond.
pub fn duration_secs(field: &str, secs: f64) -> PyResult<Duration> {
    let us = secs * 1_000_000.0;
    if !us.is_finite() || us < 0.0 || us >= u64::MAX as f64 {
        return Err(core_err(CoreError::Config {
            field: field.to_string(),
            message: format!("expected a finite, non-negative number of seconds, got {secs}"),
        }));
    }
    Ok(Duration::from_micros(us.round() as u64))
}

/// A policy argument: a name of the config, a Policy or a Limit.
pub fn resolve_policy(
    limiter: &shardlimit::Limiter,
    p: &Bound<'_, PyAny>,
) -> PyResult<shardlimit::Policy> {
    if let Ok(name) = p.cast::<PyString>() {
        return limiter.policy(&name.to_cow()?).map_err(core_err);
    }
    if let Ok(pol) = p.cast::<Policy>() {
        return Ok(pol.get().0.clone());
    }
    if let Ok(lim) = p.cast::<Limit>() {
        return Ok(lim.get().policy.clone());
    }
    Err(PyTypeError::new_err(format!(
        "policy must be a policy name (str), a Policy or a Limit, not {}",
        p.get_type().name()?
    )))
}

pub fn json_to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use serde_json::Value;
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (_, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (_, _, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

pub fn decision_obj(py: Python<'_>, d: shardlimit::Decision) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, Decision(d))?.into_any())
}

/// `(Decision, Lease | None)` from an acquire.
pub fn lease_pair<'py>(
    py: Python<'py>,
    r: (shardlimit::Decision, Option<shardlimit::Lease>),
    policy: shardlimit::Policy,
) -> PyResult<Bound<'py, PyTuple>> {
    let (decision, lease) = r;
    let lease = match lease {
        Some(lease) => Py::new(
            py,
            Lease {
                lease,
                policy,
                decision: decision.clone(),
            },
        )?
        .into_any(),
        None => py.None(),
    };
    PyTuple::new(py, [Py::new(py, Decision(decision))?.into_any(), lease])
}

/// A block TTL in seconds: a duration the core then checks (1 ms to 366 days).
pub fn ttl_arg(secs: f64) -> PyResult<Duration> {
    let us = secs * 1_000_000.0;
    if !us.is_finite() || us < 0.0 || us >= u64::MAX as f64 {
        return Err(invalid(
            "ttl",
            format!("expected a finite, positive number of seconds or None, got {secs}"),
        ));
    }
    Ok(Duration::from_micros(us.round() as u64))
}

/// The layers of a layered check: an iterable of (key, policy) or (key, policy, cost).
pub fn layers_arg(
    limiter: &shardlimit::Limiter,
    layers: &Bound<'_, PyAny>,
) -> PyResult<Vec<shardlimit::Layer>> {
    if layers.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "layers must be a list of (key, policy) or (key, policy, cost) tuples",
        ));
    }
    let mut out = Vec::new();
    for item in layers.try_iter()? {
        let item = item?;
        let t = item.cast::<PyTuple>().map_err(|_| {
            PyTypeError::new_err("each layer must be a (key, policy) or (key, policy, cost) tuple")
        })?;
        let (key, policy, cost) = match t.len() {
            2 => (t.get_item(0)?, t.get_item(1)?, None),
            3 => (t.get_item(0)?, t.get_item(1)?, Some(t.get_item(2)?)),
            n => {
                return Err(PyTypeError::new_err(format!(
                    "each layer must be a (key, policy) or (key, policy, cost) tuple, got {n} items"
                )))
            }
        };
        let key: String = key.extract()?;
        let policy = resolve_policy(limiter, &policy)?;
        out.push(shardlimit::Layer::new(
            key,
            &policy,
            cost_arg(cost.as_ref())?,
        ));
    }
    Ok(out)
}
