//! Shadow mode in Python: conversions only (the logic is the core's).

use crate::convert::{core_err, json_to_py};
use pyo3::prelude::*;

/// The policies of a check, each in shadow mode for this call.
pub fn shadowed(ps: &[shardlimit::Policy]) -> PyResult<Vec<shardlimit::Policy>> {
    ps.iter()
        .map(|p| {
            if p.shadow() {
                Ok(p.clone())
            } else {
                p.with_shadow(true).map_err(core_err)
            }
        })
        .collect()
}

/// A shadow report as a dict: `{"policy", "total", "untracked", "keys": [{"key", "count"}]}`.
pub fn report_obj(py: Python<'_>, r: shardlimit::ShadowReport) -> PyResult<Py<PyAny>> {
    Ok(json_to_py(py, &r.to_json())?.unbind())
}
