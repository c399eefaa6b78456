//! Shadow mode in Python: conversions only (the logic is the core's).
use crate::convert::Count;

use super::*;
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

#[pymethods]
impl Limiter {
    /// `check` in shadow mode for this one call: a check the limit would deny is allowed
    /// (`decision.shadow_denied`), consumes nothing and is counted for `shadow_report`.
    /// Block-list denials and `on_error` fallbacks are not shadowed.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn check_shadow(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Count<'_>,
    ) -> PyResult<Decision> {
        let ps = shadow::shadowed(&resolve_policies(self, policy)?)?;
        self.check_policies(py, key, ps, cost.get())
    }
    /// `await limiter.acheck_shadow(...)`: `check_shadow` on asyncio.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn acheck_shadow<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Count<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ps = shadow::shadowed(&resolve_policies(self, policy)?)?;
        self.acheck_policies(py, key, ps, cost.get())
    }
    /// The shadow-mode denials of the policy named `policy` by key, summed over every
    /// shard (in memory: this process's counts), most first; `top` keeps that many keys:
    /// `{"policy", "total", "untracked", "keys": [{"key", "count"}]}`.
    #[pyo3(signature = (policy, top = None))]
    fn shadow_report(
        &self,
        py: Python<'_>,
        policy: String,
        top: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let r = self.blocking(py, |l| l.shadow_report_blocking(&policy, top))?;
        shadow::report_obj(py, r)
    }
    /// `await limiter.ashadow_report(...)`.
    #[pyo3(signature = (policy, top = None))]
    fn ashadow_report<'py>(
        &self,
        py: Python<'py>,
        policy: String,
        top: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.shadow_report(&policy, top).await },
            shadow::report_obj,
        )
    }
}
