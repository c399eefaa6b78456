//! Conversions between Python values and core types, and core errors to exceptions.

use crate::{Decision, Lease, Limit, Limiter, Policy};
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

/// A `cost` or `units` argument as given: left out (1), or the object passed, None
/// included (which `cost_arg` refuses: an explicit None is not silently 1).
pub enum Count<'py> {
    Default,
    Given(Bound<'py, PyAny>),
}

impl<'py> Count<'py> {
    /// The argument for [`cost_arg`]: None when it was left out.
    pub fn get(&self) -> Option<&Bound<'py, PyAny>> {
        match self {
            Count::Default => None,
            Count::Given(v) => Some(v),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Count<'py> {
    type Error = PyErr;
    fn extract(ob: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Count::Given(ob.to_owned()))
    }
}

/// A cost or a number of units: a Python int, default 1. Negative or huge ints are an
/// InvalidArgumentError (like the core's zero), anything but an int a TypeError.
pub fn cost_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let Some(v) = v else { return Ok(1) };
    if v.is_none() {
        return Err(invalid(
            "cost",
            "None (pass an int >= 1, or leave it out for 1)".to_string(),
        ));
    }
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

/// True for a string that can only be a rate string: policy names hold no space, `/`,
/// `;`, `,` or `|`.
fn is_rate(s: &str) -> bool {
    s.contains(['/', ' ', ';', ',', '|'])
}

/// The policy of a rate string (`"5/minute"`, `"100/hour; 1000/day"`): fixed windows; a
/// string of several limits is one multi-limit policy of the core (checked together in
/// one call, its decision listing every window).
pub fn rate_policies(text: &str) -> PyResult<Vec<shardlimit::Policy>> {
    shardlimit::Policy::from_rate(text, shardlimit::Algorithm::FixedWindow)
        .map(|p| vec![p])
        .map_err(|e| core_err(as_invalid_argument(e)))
}

/// The policies of the rate strings a limiter was given, parsed once: the same string
/// names the same policies (and counters) on every call. Holds at most [`RATE_CACHE`]
/// strings; past that a string is parsed on each call.
#[derive(Default)]
pub struct Rates(std::sync::Mutex<std::collections::HashMap<String, Vec<shardlimit::Policy>>>);

/// How many distinct rate strings a limiter remembers.
pub const RATE_CACHE: usize = 1024;

impl Rates {
    pub fn get(&self, text: &str) -> PyResult<Vec<shardlimit::Policy>> {
        if let Some(ps) = self.lock().get(text) {
            return Ok(ps.clone());
        }
        let ps = rate_policies(text)?;
        let mut m = self.lock();
        if m.len() < RATE_CACHE {
            m.insert(text.to_string(), ps.clone());
        }
        Ok(ps)
    }
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Vec<shardlimit::Policy>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A limit that a call's arguments describe is an invalid argument, not a bad config.
pub fn as_invalid_argument(e: CoreError) -> CoreError {
    match e {
        CoreError::Config { field, message } => CoreError::InvalidArgument {
            what: field,
            message,
        },
        e => e,
    }
}

/// A policy argument: a name of the config, a rate string, a Policy or a Limit (one policy;
/// a Vec so that callers can take several).
pub fn resolve_policies(
    limiter: &Limiter,
    p: &Bound<'_, PyAny>,
) -> PyResult<Vec<shardlimit::Policy>> {
    if let Ok(name) = p.cast::<PyString>() {
        let name = name.to_cow()?;
        if is_rate(&name) {
            return limiter.rates.get(&name);
        }
        return limiter
            .inner()?
            .policy(&name)
            .map(|p| vec![p])
            .map_err(core_err);
    }
    if let Ok(pol) = p.cast::<Policy>() {
        return Ok(vec![pol.get().0.clone()]);
    }
    if let Ok(lim) = p.cast::<Limit>() {
        return Ok(vec![lim.get().policy.clone()]);
    }
    Err(PyTypeError::new_err(format!(
        "policy must be a policy name or a rate string (str), a Policy or a Limit, not {}",
        p.get_type().name()?
    )))
}

/// A policy argument that must be one limit (peek, acquire, lease).
pub fn resolve_policy(limiter: &Limiter, p: &Bound<'_, PyAny>) -> PyResult<shardlimit::Policy> {
    let mut ps = resolve_policies(limiter, p)?;
    if ps.len() != 1 {
        return Err(invalid(
            "policy",
            format!(
                "this call takes one limit; the rate string {} has {}",
                p.str()?,
                ps.len()
            ),
        ));
    }
    Ok(ps.remove(0))
}

/// A count of a limit (`limit`, `capacity`, `max`): an int; a negative or huge one is an
/// InvalidArgumentError naming the field, anything but an int a TypeError.
pub fn count_arg(what: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    if v.is_none() {
        return Err(invalid(
            "cost",
            "None (pass an int >= 1, or leave it out for 1)".to_string(),
        ));
    }
    if v.is_instance_of::<PyBool>() || !v.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int, not {}",
            v.get_type().name()?
        )));
    }
    v.extract::<u64>().map_err(|_| {
        invalid(
            what,
            format!("must be between 1 and {}, got {v}", shardlimit::MAX_LIMIT),
        )
    })
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
    limiter: &Limiter,
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
        let cost = cost_arg(cost.as_ref())?;
        for policy in resolve_policies(limiter, &policy)? {
            out.push(shardlimit::Layer::new(key.clone(), &policy, cost));
        }
    }
    Ok(out)
}
