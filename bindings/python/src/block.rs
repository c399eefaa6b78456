//! The block list: `block`, `unblock`, `blocked`.

use super::*;

/// A block-list entry.
#[pyclass(frozen, module = "shardlimit", name = "BlockInfo")]
pub struct BlockInfo(pub(crate) shardlimit::BlockInfo);

#[pymethods]
impl BlockInfo {
    #[getter]
    pub(crate) fn reason(&self) -> &str {
        &self.0.reason
    }
    /// Seconds left; None for a permanent block.
    #[getter]
    pub(crate) fn remaining(&self) -> Option<f64> {
        self.0.remaining.map(|d| d.as_secs_f64())
    }
    pub(crate) fn __repr__(&self) -> String {
        format!(
            "BlockInfo(reason={:?}, remaining={})",
            self.0.reason,
            self.0
                .remaining
                .map(|d| format!("{:?}", d.as_secs_f64()))
                .unwrap_or_else(|| "None".into())
        )
    }
}

#[pymethods]
impl Limiter {
    /// Puts `key` on the block list for `ttl` seconds (None: until unblocked). Every
    /// limiter sharing the shards, in any language, denies it with source "block".
    #[pyo3(signature = (key, ttl = None, reason = String::new()))]
    fn block(&self, py: Python<'_>, key: String, ttl: Option<f64>, reason: String) -> PyResult<()> {
        let ttl = ttl.map(ttl_arg).transpose()?;
        self.blocking(py, |l| l.block_blocking(&key, ttl, &reason))
    }
    /// Removes `key` from the block list; True when it was blocked.
    fn unblock(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        self.blocking(py, |l| l.unblock_blocking(&key))
    }
    /// The block-list entry of `key`, or None.
    fn blocked(&self, py: Python<'_>, key: String) -> PyResult<Option<BlockInfo>> {
        self.blocking(py, |l| l.blocked_blocking(&key))
            .map(|b| b.map(BlockInfo))
    }
    /// `await limiter.ablock(key, ttl, reason)`.
    #[pyo3(signature = (key, ttl = None, reason = String::new()))]
    fn ablock<'py>(
        &self,
        py: Python<'py>,
        key: String,
        ttl: Option<f64>,
        reason: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ttl = ttl.map(ttl_arg).transpose()?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.block(&key, ttl, &reason).await },
            |py, ()| Ok(py.None()),
        )
    }
    /// `await limiter.aunblock(key)`.
    fn aunblock<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.unblock(&key).await },
            |py, b: bool| {
                Ok(pyo3::types::PyBool::new(py, b)
                    .to_owned()
                    .into_any()
                    .unbind())
            },
        )
    }
    /// `await limiter.ablocked(key)`.
    fn ablocked<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.blocked(&key).await },
            |py, b| {
                Ok(match b {
                    Some(b) => Py::new(py, BlockInfo(b))?.into_any(),
                    None => py.None(),
                })
            },
        )
    }
}
