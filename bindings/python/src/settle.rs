//! Reserve-and-settle's handle in Python: the reservation a `reserve` returns.
use crate::convert::Count;

use super::*;
use crate::Decision;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// Units reserved by `Limiter.reserve`: settle them with `Limiter.settle` once the actual
/// cost is known (each reservation once). It carries when the units were recorded, so
/// that the unused part goes back to the window that admitted it.
#[pyclass(frozen, module = "shardlimit", name = "Reservation")]
pub struct Reservation {
    pub(crate) reservation: shardlimit::Reservation,
    pub(crate) policy: shardlimit::Policy,
    pub(crate) decision: shardlimit::Decision,
    pub(crate) settled: std::sync::atomic::AtomicBool,
}

#[pymethods]
impl Reservation {
    #[getter]
    fn key(&self) -> &str {
        &self.reservation.key
    }
    #[getter]
    fn policy(&self) -> &str {
        &self.reservation.policy
    }
    /// The units reserved.
    #[getter]
    fn units(&self) -> u64 {
        self.reservation.units
    }
    /// When the units were recorded (µs on the engine's clock).
    #[getter]
    fn at_us(&self) -> u64 {
        self.reservation.at_us
    }
    /// The decision that reserved the units.
    #[getter]
    fn decision(&self) -> Decision {
        Decision(self.decision.clone())
    }
    /// True once settled.
    #[getter]
    fn settled(&self) -> bool {
        self.settled.load(std::sync::atomic::Ordering::Acquire)
    }
    fn __repr__(&self) -> String {
        format!(
            "Reservation(key={:?}, policy={:?}, units={}, at_us={})",
            self.reservation.key,
            self.reservation.policy,
            self.reservation.units,
            self.reservation.at_us
        )
    }
}

impl Reservation {
    /// Marks it settled; an error when it was already.
    pub(crate) fn take(&self) -> PyResult<(shardlimit::Policy, shardlimit::Reservation)> {
        if self.settled.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Err(crate::convert::core_err(
                shardlimit::Error::InvalidArgument {
                    what: "reservation".into(),
                    message: "was settled already".into(),
                },
            ));
        }
        Ok((self.policy.clone(), self.reservation.clone()))
    }

    /// Gives it back to be settled again after a failure that happened before anything
    /// was sent (an invalid argument); after a backend failure it may have been applied.
    pub(crate) fn untake(&self, e: &shardlimit::Error) {
        if !e.is_backend() {
            self.settled
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

/// `(Decision, Reservation | None)` from a reserve.
pub fn reservation_pair<'py>(
    py: Python<'py>,
    r: (shardlimit::Decision, Option<shardlimit::Reservation>),
    policy: shardlimit::Policy,
) -> PyResult<Bound<'py, PyTuple>> {
    let (decision, reservation) = r;
    let reservation = match reservation {
        Some(reservation) => Py::new(
            py,
            Reservation {
                reservation,
                policy,
                decision: decision.clone(),
                settled: Default::default(),
            },
        )?
        .into_any(),
        None => py.None(),
    };
    PyTuple::new(
        py,
        [Py::new(py, Decision(decision))?.into_any(), reservation],
    )
}

#[pymethods]
impl Limiter {
    /// Consumes `cost` units of `policy` for `key` without ever denying: the key may go
    /// into debt (capped at one limit) and later checks are denied until it is repaid.
    /// The decision is always allowed; `remaining` (0 in debt) describes the key after it.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn charge(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Count<'_>,
    ) -> PyResult<Decision> {
        self.call_one(py, key, policy, cost.get(), |l, k, p, n| {
            l.charge_blocking(k, p, n)
        })
        .map(|(d, _)| Decision(d))
    }
    /// Gives `cost` units of `policy` back to `key`, never above its limit.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn refund(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Count<'_>,
    ) -> PyResult<Decision> {
        self.call_one(py, key, policy, cost.get(), |l, k, p, n| {
            l.refund_blocking(k, p, n)
        })
        .map(|(d, _)| Decision(d))
    }
    /// A check of an estimated cost: (decision, reservation or None when denied). Settle
    /// the reservation with `settle` once the actual cost is known.
    #[pyo3(signature = (key, policy, estimate = None))]
    fn reserve<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        estimate: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (r, p) = self.call_one(py, key, policy, estimate, |l, k, p, n| {
            l.reserve_blocking(k, p, n)
        })?;
        settle::reservation_pair(py, r, p)
    }
    /// Settles a reservation at its `actual` cost (0 gives it all back): the unused part
    /// goes back to the window that admitted it, the excess is charged. Once per
    /// reservation.
    fn settle(
        &self,
        py: Python<'_>,
        reservation: &settle::Reservation,
        actual: u64,
    ) -> PyResult<Decision> {
        let (policy, r) = reservation.take()?;
        let l = &self.inner()?;
        let run = || l.settle_with_blocking(&policy, &r, actual);
        let out = if l.is_redis() { py.detach(run) } else { run() };
        out.map(Decision).map_err(|e| {
            reservation.untake(&e);
            core_err(e)
        })
    }
    /// `await limiter.acharge(key, policy, cost)`.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn acharge<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Count<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            cost.get(),
            |l, k, p, n| async move { l.charge(&k, &p, n).await },
            calls::decision_of,
        )
    }
    /// `await limiter.arefund(key, policy, cost)`.
    #[pyo3(signature = (key, policy, cost = Count::Default))]
    fn arefund<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Count<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            cost.get(),
            |l, k, p, n| async move { l.refund(&k, &p, n).await },
            calls::decision_of,
        )
    }
    /// `await limiter.areserve(key, policy, estimate)` -> (decision, reservation | None).
    #[pyo3(signature = (key, policy, estimate = None))]
    fn areserve<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        estimate: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            estimate,
            |l, k, p, n| async move { l.reserve(&k, &p, n).await },
            |py, r, p| Ok(settle::reservation_pair(py, r, p)?.into_any().unbind()),
        )
    }
    /// `await limiter.asettle(reservation, actual)`.
    fn asettle<'py>(
        &self,
        py: Python<'py>,
        reservation: Py<settle::Reservation>,
        actual: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (policy, r) = reservation.get().take()?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move {
                let out = l.settle_with(&policy, &r, actual).await;
                if let Err(e) = &out {
                    reservation.get().untake(e);
                }
                out
            },
            decision_obj,
        )
    }
}
