//! The manual clock of deterministic tests.

use super::*;

/// A clock that moves only when told to (microseconds since the Unix epoch), for
/// deterministic tests: pass it as `clock=` when creating a `Limiter`.
#[pyclass(frozen, module = "shardlimit", name = "ManualClock")]
pub struct ManualClock(pub(crate) Arc<shardlimit::ManualClock>);

#[pymethods]
impl ManualClock {
    #[new]
    #[pyo3(signature = (start_us = 0))]
    pub(crate) fn new(start_us: u64) -> ManualClock {
        ManualClock(shardlimit::ManualClock::new(start_us))
    }
    pub(crate) fn set_us(&self, us: u64) {
        self.0.set_us(us)
    }
    pub(crate) fn advance_us(&self, us: u64) {
        self.0.advance_us(us)
    }
    pub(crate) fn now_us(&self) -> u64 {
        use shardlimit::Clock;
        self.0.now_us()
    }
}
