//! Limits and policies: built from Python arguments or a rate string.

use super::*;

/// An algorithm with its parameters, validated when built. Durations are in seconds.
#[pyclass(frozen, module = "shardlimit", name = "Limit")]
pub struct Limit {
    pub(crate) limit: CoreLimit,
    /// The anonymous policy a check against this limit uses (named [`CoreLimit::id`]).
    pub(crate) policy: shardlimit::Policy,
}

impl Limit {
    pub(crate) fn build(limit: CoreLimit) -> PyResult<Limit> {
        let policy = shardlimit::Policy::try_from(limit.clone())
            .map_err(|e| core_err(as_invalid_argument(e)))?;
        Ok(Limit { limit, policy })
    }
}

/// Seconds of a limit's window or lease: a bad value is an invalid argument.
pub(crate) fn period_arg(field: &str, secs: f64) -> PyResult<std::time::Duration> {
    let us = secs * 1_000_000.0;
    if !us.is_finite() || us < 0.0 || us >= u64::MAX as f64 {
        return Err(core_err(CoreError::InvalidArgument {
            what: field.to_string(),
            message: format!("expected a finite, non-negative number of seconds, got {secs}"),
        }));
    }
    Ok(std::time::Duration::from_micros(us.round() as u64))
}

pub(crate) fn algorithm_arg(name: &str) -> PyResult<shardlimit::Algorithm> {
    shardlimit::Algorithm::from_name(name).ok_or_else(|| {
        core_err(CoreError::InvalidArgument {
            what: "algorithm".into(),
            message: format!(
                "expected one of fixed_window, sliding_window, sliding_log, token_bucket, leaky_bucket, got {name:?}"
            ),
        })
    })
}

/// The limits of a rate string (`"5/minute"`, `"10 per second"`, `"100/hour; 1000/day"`,
/// `"3/5 minutes"`: the `limits` package's syntax), of `algorithm` (fixed windows by
/// default), in the order written.
#[pyfunction]
#[pyo3(signature = (text, algorithm = "fixed_window"))]
pub(crate) fn parse_rate(text: &str, algorithm: &str) -> PyResult<Vec<Limit>> {
    let limits = shardlimit::parse_rate_as(text, algorithm_arg(algorithm)?).map_err(core_err)?;
    limits.into_iter().map(Limit::build).collect()
}

#[pymethods]
impl Limit {
    /// At most `limit` units per aligned window of `window` seconds.
    #[staticmethod]
    pub(crate) fn fixed_window(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::fixed_window(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Two-counter estimate of a sliding window of `window` seconds.
    #[staticmethod]
    pub(crate) fn sliding_window(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::sliding_window(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Exact sliding window of `window` seconds (one log entry per admitted unit).
    #[staticmethod]
    pub(crate) fn sliding_log(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::sliding_log(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Starts full with `capacity` tokens and refills `refill_per_sec` per second.
    #[staticmethod]
    pub(crate) fn token_bucket(
        capacity: &Bound<'_, PyAny>,
        refill_per_sec: f64,
    ) -> PyResult<Limit> {
        Limit::build(CoreLimit::token_bucket(
            count_arg("limit.capacity", capacity)?,
            refill_per_sec,
        ))
    }
    /// A shaper: admitted requests are told how long to wait (`Decision.delay`).
    #[staticmethod]
    pub(crate) fn leaky_bucket(capacity: &Bound<'_, PyAny>, leak_per_sec: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::leaky_bucket(
            count_arg("limit.capacity", capacity)?,
            leak_per_sec,
        ))
    }
    /// At most `max` units held at once; leases expire after `lease_ttl` seconds.
    #[staticmethod]
    pub(crate) fn concurrency(max: &Bound<'_, PyAny>, lease_ttl: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::concurrency(
            count_arg("limit.max", max)?,
            period_arg("limit.lease_ttl", lease_ttl)?,
        ))
    }
    /// The one limit of a rate string (`"5/minute"`); `parse_rate` reads several.
    #[staticmethod]
    #[pyo3(signature = (text, algorithm = "fixed_window"))]
    pub(crate) fn parse(text: &str, algorithm: &str) -> PyResult<Limit> {
        let mut limits = parse_rate(text, algorithm)?;
        if limits.len() != 1 {
            return Err(core_err(CoreError::InvalidArgument {
                what: "rate".into(),
                message: format!(
                    "expected one limit, {text:?} has {}: use parse_rate",
                    limits.len()
                ),
            }));
        }
        Ok(limits.remove(0))
    }
    #[getter]
    pub(crate) fn algorithm(&self) -> &'static str {
        self.limit.algorithm().name()
    }
    /// The stable identifier used as the policy name of checks against this limit.
    #[getter]
    pub(crate) fn id(&self) -> String {
        self.limit.id()
    }
    pub(crate) fn __repr__(&self) -> String {
        format!("Limit({:?})", self.limit.id())
    }
}

/// A named, validated limit with its failure mode.
#[pyclass(frozen, module = "shardlimit", name = "Policy")]
pub struct Policy(pub shardlimit::Policy);

#[pymethods]
impl Policy {
    #[new]
    #[pyo3(signature = (name, limit, on_error = None))]
    pub(crate) fn new(name: &str, limit: &Limit, on_error: Option<&str>) -> PyResult<Policy> {
        let p = shardlimit::Policy::new(name, limit.limit.clone()).map_err(core_err)?;
        Ok(match on_error {
            None => Policy(p),
            Some(s) => Policy(p.with_on_error(
                OnError::parse(&format!("policies.{name}.on_error"), s).map_err(core_err)?,
            )),
        })
    }
    #[getter]
    pub(crate) fn name(&self) -> &str {
        self.0.name()
    }
    #[getter]
    pub(crate) fn algorithm(&self) -> &'static str {
        self.0.algorithm().name()
    }
    /// The effective limit (units per window, capacity, or max concurrent).
    #[getter]
    pub(crate) fn max(&self) -> u64 {
        self.0.max()
    }
    #[getter]
    pub(crate) fn on_error(&self) -> &'static str {
        self.0.on_error().name()
    }
    /// Every limit of the policy, in order (one unless it is a multi-limit policy).
    #[getter]
    pub(crate) fn limits(&self) -> PyResult<Vec<Limit>> {
        self.0.limits().into_iter().map(Limit::build).collect()
    }
    pub(crate) fn __repr__(&self) -> String {
        format!(
            "Policy(name={:?}, algorithm={:?}, max={}, on_error={:?})",
            self.0.name(),
            self.0.algorithm().name(),
            self.0.max(),
            self.0.on_error().name()
        )
    }
}
