//! One body per call shape of the `Limiter` methods, as the C ABI's `decide_blocking` /
//! `start_decision`: the sync method and its asyncio twin differ only in the core call
//! they make.

use crate::convert::{cost_arg, decision_obj, resolve_policy};
use crate::{same_key, Decision, Limiter};
use pyo3::prelude::*;
use std::future::Future;

impl Limiter {
    /// A check of one policy or of a multi-limit list on one key (`check`,
    /// `check_shadow`), blocking.
    pub(crate) fn check_policies(
        &self,
        py: Python<'_>,
        key: String,
        ps: Vec<shardlimit::Policy>,
        cost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        let cost = cost_arg(cost)?;
        match &ps[..] {
            [p] => self.blocking(py, |l| l.check_blocking(&key, p, cost)),
            _ => {
                let layers = same_key(&key, &ps, cost);
                self.blocking(py, |l| l.check_all_blocking(&layers))
            }
        }
        .map(Decision)
    }

    /// [`Limiter::check_policies`] on asyncio (`acheck`, `acheck_shadow`).
    pub(crate) fn acheck_policies<'py>(
        &self,
        py: Python<'py>,
        key: String,
        ps: Vec<shardlimit::Policy>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let cost = cost_arg(cost)?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move {
                match &ps[..] {
                    [p] => l.check(&key, p, cost).await,
                    _ => l.check_all(&same_key(&key, &ps, cost)).await,
                }
            },
            decision_obj,
        )
    }

    /// A (key, one policy, cost) call, blocking: its result and the resolved policy.
    pub(crate) fn call_one<T: Send>(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
        call: impl FnOnce(&shardlimit::Limiter, &str, &shardlimit::Policy, u64) -> shardlimit::Result<T>
            + Send,
    ) -> PyResult<(T, shardlimit::Policy)> {
        let p = resolve_policy(self, policy)?;
        let cost = cost_arg(cost)?;
        let r = self.blocking(py, |l| call(l, &key, &p, cost))?;
        Ok((r, p))
    }

    /// [`Limiter::call_one`] on asyncio: `call` makes the core's future, `convert` turns
    /// its result (with the resolved policy) into the Python value on the loop thread.
    pub(crate) fn acall_one<'py, T, F>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
        call: impl FnOnce(shardlimit::Limiter, String, shardlimit::Policy, u64) -> F,
        convert: impl FnOnce(Python<'_>, T, shardlimit::Policy) -> PyResult<Py<PyAny>> + Send + 'static,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: Send + 'static,
        F: Future<Output = shardlimit::Result<T>> + Send + 'static,
    {
        let p = resolve_policy(self, policy)?;
        let cost = cost_arg(cost)?;
        let l = self.inner()?;
        let fut = call(l, key, p.clone(), cost);
        self.completers
            .coroutine(py, &self.inner()?, fut, move |py, r| convert(py, r, p))
    }
}

/// The `convert` of [`Limiter::acall_one`] for a decision.
pub(crate) fn decision_of(
    py: Python<'_>,
    d: shardlimit::Decision,
    _: shardlimit::Policy,
) -> PyResult<Py<PyAny>> {
    decision_obj(py, d)
}
