//! Live per-key overrides: argument and result conversion only (the logic is the core's).

use super::*;
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

#[pymethods]
impl Limiter {
    /// Sets `key`'s live override of `policy` (a config policy with `"overrides": true`)
    /// to `limit`: a rate string ("100/minute"), a limit object in JSON or a dict as in a
    /// config policy; for `ttl` seconds (None: until deleted). Every process's next check
    /// of the key, in any language, is decided by it. Returns the override as a dict:
    /// `{"key", "policy", "limit": {...}, "remaining_ms": int | None}`.
    #[pyo3(signature = (key, policy, limit, ttl = None))]
    fn set_override(
        &self,
        py: Python<'_>,
        key: String,
        policy: String,
        limit: &Bound<'_, PyAny>,
        ttl: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let limit = overrides::limit_text(limit)?;
        let ttl = ttl.map(ttl_arg).transpose()?;
        let info = self.blocking(py, |l| l.set_override_blocking(&key, &policy, &limit, ttl))?;
        overrides::json_obj(py, &info.to_json())
    }
    /// `await limiter.aset_override(key, policy, limit, ttl)`.
    #[pyo3(signature = (key, policy, limit, ttl = None))]
    fn aset_override<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: String,
        limit: &Bound<'py, PyAny>,
        ttl: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limit = overrides::limit_text(limit)?;
        let ttl = ttl.map(ttl_arg).transpose()?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.set_override(&key, &policy, &limit, ttl).await },
            |py, info| overrides::json_obj(py, &info.to_json()),
        )
    }
    /// `key`'s override of `policy` (the dict `set_override` returns), or None.
    fn get_override(&self, py: Python<'_>, key: String, policy: String) -> PyResult<Py<PyAny>> {
        match self.blocking(py, |l| l.get_override_blocking(&key, &policy))? {
            Some(info) => overrides::json_obj(py, &info.to_json()),
            None => Ok(py.None()),
        }
    }
    /// `await limiter.aget_override(key, policy)`.
    fn aget_override<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.get_override(&key, &policy).await },
            |py, info| match info {
                Some(info) => overrides::json_obj(py, &info.to_json()),
                None => Ok(py.None()),
            },
        )
    }
    /// One page of `policy`'s overrides on every shard, about `limit` of them:
    /// `{"overrides": [...], "cursor": str | None}`; pass the cursor back for the next
    /// page (None: the last).
    #[pyo3(signature = (policy, cursor = None, limit = 1000))]
    fn list_overrides(
        &self,
        py: Python<'_>,
        policy: String,
        cursor: Option<String>,
        limit: usize,
    ) -> PyResult<Py<PyAny>> {
        let page = self.blocking(py, |l| {
            l.list_overrides_blocking(&policy, cursor.as_deref(), limit)
        })?;
        overrides::json_obj(py, &page.to_json())
    }
    /// `await limiter.alist_overrides(policy, cursor, limit)`.
    #[pyo3(signature = (policy, cursor = None, limit = 1000))]
    fn alist_overrides<'py>(
        &self,
        py: Python<'py>,
        policy: String,
        cursor: Option<String>,
        limit: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.list_overrides(&policy, cursor.as_deref(), limit).await },
            |py, page| overrides::json_obj(py, &page.to_json()),
        )
    }
    /// Deletes `key`'s override of `policy`; True when it had one.
    fn delete_override(&self, py: Python<'_>, key: String, policy: String) -> PyResult<bool> {
        self.blocking(py, |l| l.delete_override_blocking(&key, &policy))
    }
    /// `await limiter.adelete_override(key, policy)`.
    fn adelete_override<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.delete_override(&key, &policy).await },
            |py, b: bool| {
                Ok(pyo3::types::PyBool::new(py, b)
                    .to_owned()
                    .into_any()
                    .unbind())
            },
        )
    }
}
