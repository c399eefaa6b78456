//! Checks: one key (`check`, `peek`, `reset`) and layered (`check_all`), sync and async.
use crate::convert::Count;

use super::*;

/// The layers of a check of several limits (a rate string such as "10/second; 100/minute")
/// on one key: one atomic layered check.
pub(crate) fn same_key(key: &str, ps: &[shardlimit::Policy], cost: u64) -> Vec<shardlimit::Layer> {
    ps.iter()
        .map(|p| shardlimit::Layer::new(key.to_string(), p, cost))
        .collect()
}

#[pymethods]
impl Limiter {
    /// Checks `cost` units of `policy` (a name, a Policy or a Limit) for `key`.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn check(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Count<'_>,
    ) -> PyResult<Decision> {
        let ps = resolve_policies(self, policy)?;
        self.check_policies(py, key, ps, cost.get())
    }
    /// `await limiter.acheck(...)`: `check` on asyncio, never blocking the event loop.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn acheck<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Count<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        let ps = resolve_policies(me, policy)?;
        if me.host.is_some() && ps.len() == 1 {
            return host::acheck(slf, key, ps, cost_arg(cost.get())?);
        }
        me.acheck_policies(py, key, ps, cost.get())
    }
    /// `key`'s state without consuming: would a check of one unit pass now?
    fn peek(&self, py: Python<'_>, key: String, policy: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let p = resolve_policy(self, policy)?;
        self.blocking(py, |l| l.peek_blocking(&key, &p))
            .map(Decision)
    }
    /// `await limiter.apeek(...)`.
    fn apeek<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let p = resolve_policy(self, policy)?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.peek(&key, &p).await },
            decision_obj,
        )
    }
    /// Forgets `key`'s state under `policy`: its full budget is back.
    fn reset(&self, py: Python<'_>, key: String, policy: &Bound<'_, PyAny>) -> PyResult<()> {
        let ps = resolve_policies(self, policy)?;
        self.blocking(py, |l| {
            ps.iter().try_for_each(|p| l.reset_blocking(&key, p))
        })
    }
    /// `await limiter.areset(key, policy)`.
    fn areset<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ps = resolve_policies(self, policy)?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move {
                for p in &ps {
                    l.reset(&key, p).await?;
                }
                Ok(())
            },
            |py, ()| Ok(py.None()),
        )
    }
    /// A layered check: `layers` is a list of (key, policy) or (key, policy, cost). Allowed
    /// only if every layer allows; when any layer denies, no layer consumes.
    /// `decision.layer` is the index of the layer the decision describes.
    fn check_all(&self, py: Python<'_>, layers: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let layers = layers_arg(self, layers)?;
        self.blocking(py, |l| l.check_all_blocking(&layers))
            .map(Decision)
    }
    /// `await limiter.acheck_all(layers)`.
    fn acheck_all<'py>(
        &self,
        py: Python<'py>,
        layers: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let layers = layers_arg(self, layers)?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.check_all(&layers).await },
            decision_obj,
        )
    }
}
