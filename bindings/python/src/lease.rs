//! Leases of a concurrency policy: `acquire`, `release` and the `lease` context manager.
use crate::convert::Count;

use super::*;

/// Held units of a concurrency policy; give them back with `Limiter.release`.
#[pyclass(frozen, module = "shardlimit", name = "Lease")]
pub struct Lease {
    pub(crate) lease: shardlimit::Lease,
    pub(crate) policy: shardlimit::Policy,
    pub(crate) decision: shardlimit::Decision,
}

#[pymethods]
impl Lease {
    #[getter]
    pub(crate) fn key(&self) -> &str {
        &self.lease.key
    }
    #[getter]
    pub(crate) fn policy(&self) -> &str {
        &self.lease.policy
    }
    #[getter]
    pub(crate) fn id(&self) -> &str {
        &self.lease.id
    }
    #[getter]
    pub(crate) fn units(&self) -> u64 {
        self.lease.units
    }
    /// The decision that granted this lease.
    #[getter]
    pub(crate) fn decision(&self) -> Decision {
        Decision(self.decision.clone())
    }
    pub(crate) fn __repr__(&self) -> String {
        format!(
            "Lease(key={:?}, policy={:?}, id={:?}, units={})",
            self.lease.key, self.lease.policy, self.lease.id, self.lease.units
        )
    }
}

/// `with limiter.lease(key, policy):` / `async with ...`: acquires on entry (raising
/// RateLimitExceeded when denied), releases on exit.
#[pyclass(frozen, module = "shardlimit", name = "LeaseContext")]
pub struct LeaseContext {
    pub(crate) limiter: Py<Limiter>,
    pub(crate) key: String,
    pub(crate) policy: shardlimit::Policy,
    pub(crate) units: u64,
    pub(crate) held: Mutex<Option<(shardlimit::Lease, shardlimit::Policy)>>,
}

impl LeaseContext {
    pub(crate) fn take_held(&self) -> Option<(shardlimit::Lease, shardlimit::Policy)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Turns an acquire result into the entered Lease, or RateLimitExceeded when denied.
pub(crate) fn entered(
    py: Python<'_>,
    ctx: &Py<LeaseContext>,
    r: (shardlimit::Decision, Option<shardlimit::Lease>),
) -> PyResult<Py<PyAny>> {
    let (decision, lease) = r;
    match lease {
        None => Err(rate_limit_exceeded(py, decision)),
        Some(lease) => {
            let c = ctx.get();
            *c.held.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((lease.clone(), c.policy.clone()));
            Ok(Py::new(
                py,
                Lease {
                    lease,
                    policy: c.policy.clone(),
                    decision,
                },
            )?
            .into_any())
        }
    }
}

#[pymethods]
impl LeaseContext {
    pub(crate) fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let limiter = me.limiter.get();
        let (key, policy, units) = (me.key.clone(), me.policy.clone(), me.units);
        let r = limiter.blocking(py, |l| l.acquire_blocking(&key, &policy, units))?;
        entered(py, &slf.clone().unbind(), r)
    }
    #[pyo3(signature = (*_exc))]
    pub(crate) fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if let Some((lease, policy)) = self.take_held() {
            self.limiter.get().blocking(py, |l| {
                let me = l.clone();
                l.block_on(async move { me.release_with(&policy, &lease).await })
            })?;
        }
        Ok(false)
    }
    pub(crate) fn __aenter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let limiter = me.limiter.get();
        let l = limiter.inner()?;
        let (key, policy, units) = (me.key.clone(), me.policy.clone(), me.units);
        let ctx = slf.clone().unbind();
        limiter.completers.spawn(
            py,
            &limiter.inner()?,
            async move { l.acquire(&key, &policy, units).await },
            move |py, r| entered(py, &ctx, r),
        )
    }
    #[pyo3(signature = (*_exc))]
    pub(crate) fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _exc: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limiter = self.limiter.get();
        let held = self.take_held();
        let l = limiter.inner()?;
        limiter.completers.spawn(
            py,
            &limiter.inner()?,
            async move {
                if let Some((lease, policy)) = held {
                    l.release_with(&policy, &lease).await?;
                }
                Ok(())
            },
            |py, ()| {
                Ok(pyo3::types::PyBool::new(py, false)
                    .to_owned()
                    .into_any()
                    .unbind())
            },
        )
    }
}

#[pymethods]
impl Limiter {
    /// Acquires `units` of a concurrency policy: (decision, lease or None when denied).
    #[pyo3(signature = (key, policy, units = Count::Default))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        units: Count<'py>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (r, p) = self.call_one(py, key, policy, units.get(), |l, k, p, n| {
            l.acquire_blocking(k, p, n)
        })?;
        lease_pair(py, r, p)
    }
    /// `await limiter.aacquire(...)` -> (decision, lease or None).
    #[pyo3(signature = (key, policy, units = Count::Default))]
    fn aacquire<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        units: Count<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            units.get(),
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            |py, r, p| Ok(lease_pair(py, r, p)?.into_any().unbind()),
        )
    }
    /// Releases a lease. False when it was no longer held (released before, or expired).
    fn release(&self, py: Python<'_>, lease: &Lease) -> PyResult<bool> {
        let (policy, lease) = (lease.policy.clone(), lease.lease.clone());
        self.blocking(py, |l| {
            let me = l.clone();
            l.block_on(async move { me.release_with(&policy, &lease).await })
        })
    }
    /// `await limiter.arelease(lease)` -> bool.
    fn arelease<'py>(&self, py: Python<'py>, lease: &Lease) -> PyResult<Bound<'py, PyAny>> {
        let (policy, lease) = (lease.policy.clone(), lease.lease.clone());
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.release_with(&policy, &lease).await },
            |py, b: bool| {
                Ok(pyo3::types::PyBool::new(py, b)
                    .to_owned()
                    .into_any()
                    .unbind())
            },
        )
    }
    /// A context manager holding `units` of a concurrency policy for the `with` block
    /// (`with` and `async with`); raises RateLimitExceeded when denied.
    #[pyo3(signature = (key, policy, units = Count::Default))]
    fn lease(
        slf: &Bound<'_, Self>,
        key: String,
        policy: &Bound<'_, PyAny>,
        units: Count<'_>,
    ) -> PyResult<LeaseContext> {
        let me = slf.get();
        Ok(LeaseContext {
            limiter: slf.clone().unbind(),
            key,
            policy: resolve_policy(me, policy)?,
            units: cost_arg(units.get())?,
            held: Mutex::new(None),
        })
    }
}
