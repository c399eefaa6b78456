//! Live per-key overrides: argument and result conversion only (the logic is the core's).

use pyo3::prelude::*;
use pyo3::types::PyString;

/// A limit as Python passes it: a rate string or a limit object in JSON (text), or a dict
/// (serialized to the same JSON).
pub fn limit_text(limit: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = limit.cast::<PyString>() {
        return s.extract::<String>();
    }
    if limit.is_instance_of::<pyo3::types::PyDict>() {
        let json = limit.py().import("json")?;
        return json.call_method1("dumps", (limit,))?.extract();
    }
    Err(crate::convert::core_err(
        shardlimit::Error::InvalidArgument {
            what: "limit".into(),
            message: format!(
                "expected a rate string, a limit object in JSON or a dict, got {}",
                limit.get_type().name()?
            ),
        },
    ))
}

/// A JSON value from the core (`OverrideInfo::to_json`, `OverridePage::to_json`) as plain
/// Python dicts and lists.
pub fn json_obj(py: Python<'_>, v: &serde_json::Value) -> PyResult<Py<PyAny>> {
    Ok(crate::convert::json_to_py(py, v)?.unbind())
}
