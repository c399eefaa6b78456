//! Reserve-and-settle's handle in Python: the reservation a `reserve` returns.

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
