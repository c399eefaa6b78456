//! The answer to a check, as Python sees it.

use super::*;

/// The answer to a check. Immutable; `bool(decision)` is `decision.allowed`.
#[pyclass(frozen, eq, module = "shardlimit", name = "Decision")]
#[derive(PartialEq)]
pub struct Decision(pub shardlimit::Decision);

#[pymethods]
impl Decision {
    /// Whether the request may proceed. A denied check consumed nothing.
    #[getter]
    pub(crate) fn allowed(&self) -> bool {
        self.0.allowed
    }
    /// The effective limit (units per window, bucket capacity, or max concurrent).
    #[getter]
    pub(crate) fn limit(&self) -> u64 {
        self.0.limit
    }
    /// Units still available after this check.
    #[getter]
    pub(crate) fn remaining(&self) -> u64 {
        self.0.remaining
    }
    /// Seconds until the budget is full again with no further traffic.
    #[getter]
    pub(crate) fn reset_after(&self) -> f64 {
        self.0.reset_after.as_secs_f64()
    }
    /// When denied: seconds until the same check would pass; None when allowed or when the
    /// cost can never fit.
    #[getter]
    pub(crate) fn retry_after(&self) -> Option<f64> {
        self.0.retry_after.map(|d| d.as_secs_f64())
    }
    /// Leaky bucket: seconds to wait before sending. 0.0 otherwise.
    #[getter]
    pub(crate) fn delay(&self) -> f64 {
        self.0.delay.as_secs_f64()
    }
    /// The window the limit is measured over, in seconds.
    #[getter]
    pub(crate) fn window(&self) -> f64 {
        self.0.window.as_secs_f64()
    }
    /// The policy that decided.
    #[getter]
    pub(crate) fn policy(&self) -> &str {
        &self.0.policy
    }
    /// Who decided: "redis", "memory", "local", "fallback" or "block".
    #[getter]
    pub(crate) fn source(&self) -> &'static str {
        self.0.source.name()
    }
    /// The index of the Redis shard that decided, if one did.
    #[getter]
    pub(crate) fn shard(&self) -> Option<u32> {
        self.0.shard
    }
    /// Layered checks: the index of the layer this decision describes (the one that
    /// denied, or the tightest when all allowed). None for single checks.
    #[getter]
    pub(crate) fn layer(&self) -> Option<usize> {
        self.0.layer
    }
    /// A multi-limit policy: the index of the limit this decision describes (the one that
    /// denied, or the tightest). None for a policy of one limit.
    #[getter]
    pub(crate) fn limit_index(&self) -> Option<usize> {
        self.0.limit_index
    }
    /// A multi-limit policy: every limit in force as (limit, window in seconds), in the
    /// policy's order (what `RateLimit-Policy` lists). Empty for a policy of one limit.
    #[getter]
    pub(crate) fn quotas(&self) -> Vec<(u64, f64)> {
        self.0
            .quotas
            .iter()
            .map(|q| (q.limit, q.window.as_secs_f64()))
            .collect()
    }
    /// Shadow mode: the limit would have denied this check, but its policy (or the call,
    /// `check_shadow`) is in shadow, so it was allowed and consumed nothing.
    #[getter]
    pub(crate) fn shadow_denied(&self) -> bool {
        self.0.shadow_denied
    }
    /// The standard rate-limit response headers, in a stable order.
    pub(crate) fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.0.headers() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    /// The headers as a middleware sends them, for `shardlimit._http`: only the sets asked
    /// (`x_ratelimit`: `X-RateLimit-*`; `ietf`: `RateLimit`, `RateLimit-Policy`;
    /// `Retry-After` always), the core's values rendered at `now` (Unix seconds;
    /// `X-RateLimit-Reset` is the Unix time of the reset, as from `headers()`), as (name,
    /// value) pairs of `bytes` with names in lower case (`raw`, ASGI) or of `str` (WSGI).
    /// One call instead of a dict and a loop in Python per request.
    #[pyo3(signature = (x_ratelimit, ietf, now, raw))]
    pub(crate) fn _wire_headers<'py>(
        &self,
        py: Python<'py>,
        x_ratelimit: bool,
        ietf: bool,
        now: f64,
        raw: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let now = std::time::Duration::try_from_secs_f64(now)
            .ok()
            .and_then(|d| std::time::UNIX_EPOCH.checked_add(d))
            .unwrap_or(std::time::UNIX_EPOCH);
        for (name, value) in self.0.headers_at(now) {
            let is_ietf = name == "RateLimit" || name == "RateLimit-Policy";
            if name != "Retry-After" && !(if is_ietf { ietf } else { x_ratelimit }) {
                continue;
            }
            if raw {
                let name = pyo3::types::PyBytes::new(py, name.to_ascii_lowercase().as_bytes());
                let value = pyo3::types::PyBytes::new(py, value.as_bytes());
                out.append((name, value))?;
            } else {
                out.append((name, value))?;
            }
        }
        Ok(out)
    }
    /// The JSON body of a 429 response, as a dict.
    pub(crate) fn body<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.0.body())
    }
    /// The decision as the CLI prints it (durations in milliseconds), as a dict.
    pub(crate) fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.0.to_json())
    }
    /// The decision as the CLI prints it, as JSON text.
    pub(crate) fn to_json(&self) -> String {
        self.0.to_json().to_string()
    }
    pub(crate) fn __bool__(&self) -> bool {
        self.0.allowed
    }
    pub(crate) fn __repr__(&self) -> String {
        let d = &self.0;
        format!(
            "Decision(allowed={}, limit={}, remaining={}, reset_after={:?}, retry_after={}, delay={:?}, policy={:?}, source={:?})",
            if d.allowed { "True" } else { "False" },
            d.limit,
            d.remaining,
            d.reset_after.as_secs_f64(),
            d.retry_after
                .map(|r| format!("{:?}", r.as_secs_f64()))
                .unwrap_or_else(|| "None".into()),
            d.delay.as_secs_f64(),
            &*d.policy,
            d.source.name(),
        )
    }
}
