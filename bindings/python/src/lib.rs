//! `shardlimit._shardlimit`: the Python skin over the shardlimit core.
//!
//! Everything here converts types and errors; the logic lives in the core. Sync calls
//! release the GIL while they wait on Redis. Async calls are spawned on the limiter's own
//! Tokio runtime ([`shardlimit::Limiter::spawner`]) and resolve an asyncio future
//! through [`completion`]: the I/O thread never takes the GIL.

mod calls;
mod completion;
mod convert;
mod delivery;
mod host;
mod logging;
mod overrides;
mod settle;
mod shadow;

use convert::{
    as_invalid_argument, core_err, cost_arg, count_arg, decision_obj, json_to_py, layers_arg,
    lease_pair, rate_limit_exceeded, resolve_policies, resolve_policy, ttl_arg,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use shardlimit::{Error as CoreError, ErrorKind, Limit as CoreLimit, OnError};
use std::sync::{Arc, Mutex};

/// The answer to a check. Immutable; `bool(decision)` is `decision.allowed`.
#[pyclass(frozen, eq, module = "shardlimit", name = "Decision")]
#[derive(PartialEq)]
pub struct Decision(pub shardlimit::Decision);

#[pymethods]
impl Decision {
    /// Whether the request may proceed. A denied check consumed nothing.
    #[getter]
    fn allowed(&self) -> bool {
        self.0.allowed
    }
    /// The effective limit (units per window, bucket capacity, or max concurrent).
    #[getter]
    fn limit(&self) -> u64 {
        self.0.limit
    }
    /// Units still available after this check.
    #[getter]
    fn remaining(&self) -> u64 {
        self.0.remaining
    }
    /// Seconds until the budget is full again with no further traffic.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.0.reset_after.as_secs_f64()
    }
    /// When denied: seconds until the same check would pass; None when allowed or when the
    /// cost can never fit.
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.0.retry_after.map(|d| d.as_secs_f64())
    }
    /// Leaky bucket: seconds to wait before sending. 0.0 otherwise.
    #[getter]
    fn delay(&self) -> f64 {
        self.0.delay.as_secs_f64()
    }
    /// The window the limit is measured over, in seconds.
    #[getter]
    fn window(&self) -> f64 {
        self.0.window.as_secs_f64()
    }
    /// The policy that decided.
    #[getter]
    fn policy(&self) -> &str {
        &self.0.policy
    }
    /// Who decided: "redis", "memory", "local", "fallback" or "block".
    #[getter]
    fn source(&self) -> &'static str {
        self.0.source.name()
    }
    /// The index of the Redis shard that decided, if one did.
    #[getter]
    fn shard(&self) -> Option<u32> {
        self.0.shard
    }
    /// Layered checks: the index of the layer this decision describes (the one that
    /// denied, or the tightest when all allowed). None for single checks.
    #[getter]
    fn layer(&self) -> Option<usize> {
        self.0.layer
    }
    /// A multi-limit policy: the index of the limit this decision describes (the one that
    /// denied, or the tightest). None for a policy of one limit.
    #[getter]
    fn limit_index(&self) -> Option<usize> {
        self.0.limit_index
    }
    /// A multi-limit policy: every limit in force as (limit, window in seconds), in the
    /// policy's order (what `RateLimit-Policy` lists). Empty for a policy of one limit.
    #[getter]
    fn quotas(&self) -> Vec<(u64, f64)> {
        self.0
            .quotas
            .iter()
            .map(|q| (q.limit, q.window.as_secs_f64()))
            .collect()
    }
    /// Shadow mode: the limit would have denied this check, but its policy (or the call,
    /// `check_shadow`) is in shadow, so it was allowed and consumed nothing.
    #[getter]
    fn shadow_denied(&self) -> bool {
        self.0.shadow_denied
    }
    /// The standard rate-limit response headers, in a stable order.
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.0.headers() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
    /// The headers as a middleware sends them, for `shardlimit._http`: only the sets asked
    /// (`x_ratelimit`: `X-RateLimit-*`; `ietf`: `RateLimit`, `RateLimit-Policy`;
    /// `Retry-After` always), `X-RateLimit-Reset` as the Unix time `now + reset` (whole
    /// seconds), as (name, value) pairs of `bytes` with names in lower case (`raw`, ASGI)
    /// or of `str` (WSGI). One call instead of a dict and a loop in Python per request.
    #[pyo3(signature = (x_ratelimit, ietf, now, raw))]
    fn _wire_headers<'py>(
        &self,
        py: Python<'py>,
        x_ratelimit: bool,
        ietf: bool,
        now: f64,
        raw: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for (name, value) in self.0.headers() {
            let is_ietf = name == "RateLimit" || name == "RateLimit-Policy";
            if name != "Retry-After" && !(if is_ietf { ietf } else { x_ratelimit }) {
                continue;
            }
            let value = if name == "X-RateLimit-Reset" {
                let reset: u64 = value.parse().unwrap_or(0);
                (now.max(0.0).floor() as u64)
                    .saturating_add(reset)
                    .to_string()
            } else {
                value
            };
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
    fn body<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.0.body())
    }
    /// The decision as the CLI prints it (durations in milliseconds), as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json_to_py(py, &self.0.to_json())
    }
    /// The decision as the CLI prints it, as JSON text.
    fn to_json(&self) -> String {
        self.0.to_json().to_string()
    }
    fn __bool__(&self) -> bool {
        self.0.allowed
    }
    fn __repr__(&self) -> String {
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

/// An algorithm with its parameters, validated when built. Durations are in seconds.
#[pyclass(frozen, module = "shardlimit", name = "Limit")]
pub struct Limit {
    limit: CoreLimit,
    /// The anonymous policy a check against this limit uses (named [`CoreLimit::id`]).
    policy: shardlimit::Policy,
}

impl Limit {
    fn build(limit: CoreLimit) -> PyResult<Limit> {
        let policy = shardlimit::Policy::try_from(limit.clone())
            .map_err(|e| core_err(as_invalid_argument(e)))?;
        Ok(Limit { limit, policy })
    }
}

/// Seconds of a limit's window or lease: a bad value is an invalid argument.
fn period_arg(field: &str, secs: f64) -> PyResult<std::time::Duration> {
    let us = secs * 1_000_000.0;
    if !us.is_finite() || us < 0.0 || us >= u64::MAX as f64 {
        return Err(core_err(CoreError::InvalidArgument {
            what: field.to_string(),
            message: format!("expected a finite, non-negative number of seconds, got {secs}"),
        }));
    }
    Ok(std::time::Duration::from_micros(us.round() as u64))
}

fn algorithm_arg(name: &str) -> PyResult<shardlimit::Algorithm> {
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
fn parse_rate(text: &str, algorithm: &str) -> PyResult<Vec<Limit>> {
    let limits = shardlimit::parse_rate_as(text, algorithm_arg(algorithm)?).map_err(core_err)?;
    limits.into_iter().map(Limit::build).collect()
}

#[pymethods]
impl Limit {
    /// At most `limit` units per aligned window of `window` seconds.
    #[staticmethod]
    fn fixed_window(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::fixed_window(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Two-counter estimate of a sliding window of `window` seconds.
    #[staticmethod]
    fn sliding_window(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::sliding_window(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Exact sliding window of `window` seconds (one log entry per admitted unit).
    #[staticmethod]
    fn sliding_log(limit: &Bound<'_, PyAny>, window: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::sliding_log(
            count_arg("limit.limit", limit)?,
            period_arg("limit.window", window)?,
        ))
    }
    /// Starts full with `capacity` tokens and refills `refill_per_sec` per second.
    #[staticmethod]
    fn token_bucket(capacity: &Bound<'_, PyAny>, refill_per_sec: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::token_bucket(
            count_arg("limit.capacity", capacity)?,
            refill_per_sec,
        ))
    }
    /// A shaper: admitted requests are told how long to wait (`Decision.delay`).
    #[staticmethod]
    fn leaky_bucket(capacity: &Bound<'_, PyAny>, leak_per_sec: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::leaky_bucket(
            count_arg("limit.capacity", capacity)?,
            leak_per_sec,
        ))
    }
    /// At most `max` units held at once; leases expire after `lease_ttl` seconds.
    #[staticmethod]
    fn concurrency(max: &Bound<'_, PyAny>, lease_ttl: f64) -> PyResult<Limit> {
        Limit::build(CoreLimit::concurrency(
            count_arg("limit.max", max)?,
            period_arg("limit.lease_ttl", lease_ttl)?,
        ))
    }
    /// The one limit of a rate string (`"5/minute"`); `parse_rate` reads several.
    #[staticmethod]
    #[pyo3(signature = (text, algorithm = "fixed_window"))]
    fn parse(text: &str, algorithm: &str) -> PyResult<Limit> {
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
    fn algorithm(&self) -> &'static str {
        self.limit.algorithm().name()
    }
    /// The stable identifier used as the policy name of checks against this limit.
    #[getter]
    fn id(&self) -> String {
        self.limit.id()
    }
    fn __repr__(&self) -> String {
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
    fn new(name: &str, limit: &Limit, on_error: Option<&str>) -> PyResult<Policy> {
        let p = shardlimit::Policy::new(name, limit.limit.clone()).map_err(core_err)?;
        Ok(match on_error {
            None => Policy(p),
            Some(s) => Policy(p.with_on_error(
                OnError::parse(&format!("policies.{name}.on_error"), s).map_err(core_err)?,
            )),
        })
    }
    #[getter]
    fn name(&self) -> &str {
        self.0.name()
    }
    #[getter]
    fn algorithm(&self) -> &'static str {
        self.0.algorithm().name()
    }
    /// The effective limit (units per window, capacity, or max concurrent).
    #[getter]
    fn max(&self) -> u64 {
        self.0.max()
    }
    #[getter]
    fn on_error(&self) -> &'static str {
        self.0.on_error().name()
    }
    /// Every limit of the policy, in order (one unless it is a multi-limit policy).
    #[getter]
    fn limits(&self) -> PyResult<Vec<Limit>> {
        self.0.limits().into_iter().map(Limit::build).collect()
    }
    fn __repr__(&self) -> String {
        format!(
            "Policy(name={:?}, algorithm={:?}, max={}, on_error={:?})",
            self.0.name(),
            self.0.algorithm().name(),
            self.0.max(),
            self.0.on_error().name()
        )
    }
}

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
    fn key(&self) -> &str {
        &self.lease.key
    }
    #[getter]
    fn policy(&self) -> &str {
        &self.lease.policy
    }
    #[getter]
    fn id(&self) -> &str {
        &self.lease.id
    }
    #[getter]
    fn units(&self) -> u64 {
        self.lease.units
    }
    /// The decision that granted this lease.
    #[getter]
    fn decision(&self) -> Decision {
        Decision(self.decision.clone())
    }
    fn __repr__(&self) -> String {
        format!(
            "Lease(key={:?}, policy={:?}, id={:?}, units={})",
            self.lease.key, self.lease.policy, self.lease.id, self.lease.units
        )
    }
}

/// A block-list entry.
#[pyclass(frozen, module = "shardlimit", name = "BlockInfo")]
pub struct BlockInfo(shardlimit::BlockInfo);

#[pymethods]
impl BlockInfo {
    #[getter]
    fn reason(&self) -> &str {
        &self.0.reason
    }
    /// Seconds left; None for a permanent block.
    #[getter]
    fn remaining(&self) -> Option<f64> {
        self.0.remaining.map(|d| d.as_secs_f64())
    }
    fn __repr__(&self) -> String {
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

/// Trusted proxy networks (`10.0.0.0/8`, `2001:db8::/32`, bare addresses), parsed once.
#[pyclass(frozen, module = "shardlimit", name = "TrustedProxies")]
pub struct TrustedProxies(shardlimit::TrustedProxies);

#[pymethods]
impl TrustedProxies {
    #[new]
    #[pyo3(signature = (cidrs = Vec::new()))]
    fn new(cidrs: Vec<String>) -> PyResult<TrustedProxies> {
        shardlimit::TrustedProxies::parse(&cidrs)
            .map(TrustedProxies)
            .map_err(core_err)
    }
    /// The client's address: `peer` (with or without a port) unless it is a trusted proxy;
    /// then X-Forwarded-For from the right, up to the first address not trusted.
    #[pyo3(signature = (peer, x_forwarded_for = None))]
    fn client_ip(&self, peer: &str, x_forwarded_for: Option<&str>) -> PyResult<String> {
        let peer = shardlimit::parse_peer(peer).map_err(core_err)?;
        Ok(shardlimit::client_ip_with(peer, x_forwarded_for, &self.0).to_string())
    }
    fn __contains__(&self, ip: &str) -> PyResult<bool> {
        Ok(self
            .0
            .contains(shardlimit::parse_peer(ip).map_err(core_err)?))
    }
}

/// The rate-limit key of a client address (the core's `ip_key`): IPv4, also IPv4-mapped,
/// as itself; IPv6 as its network of `ipv6_prefix` bits (1 to 128), `2001:db8:1:2::/64`.
#[pyfunction]
#[pyo3(signature = (ip, ipv6_prefix = shardlimit::DEFAULT_IPV6_PREFIX))]
fn ip_key(ip: &str, ipv6_prefix: u8) -> PyResult<String> {
    shardlimit::client_ip_key(ip, None, &[] as &[&str], ipv6_prefix).map_err(core_err)
}

/// The client's address behind proxies (see `TrustedProxies.client_ip`).
#[pyfunction]
#[pyo3(signature = (peer, x_forwarded_for = None, trusted_proxies = Vec::new()))]
fn client_ip(
    peer: &str,
    x_forwarded_for: Option<&str>,
    trusted_proxies: Vec<String>,
) -> PyResult<String> {
    shardlimit::client_ip(peer, x_forwarded_for, &trusted_proxies)
        .map(|ip| ip.to_string())
        .map_err(core_err)
}

/// A clock that moves only when told to (microseconds since the Unix epoch), for
/// deterministic tests: pass it as `clock=` when creating a `Limiter`.
#[pyclass(frozen, module = "shardlimit", name = "ManualClock")]
pub struct ManualClock(Arc<shardlimit::ManualClock>);

#[pymethods]
impl ManualClock {
    #[new]
    #[pyo3(signature = (start_us = 0))]
    fn new(start_us: u64) -> ManualClock {
        ManualClock(shardlimit::ManualClock::new(start_us))
    }
    fn set_us(&self, us: u64) {
        self.0.set_us(us)
    }
    fn advance_us(&self, us: u64) {
        self.0.advance_us(us)
    }
    fn now_us(&self) -> u64 {
        use shardlimit::Clock;
        self.0.now_us()
    }
}

/// A rate limiter: a config, an engine (Redis shards or in-memory) and its own I/O runtime.
/// Thread-safe, fork-safe; share one per process.
#[pyclass(frozen, module = "shardlimit", name = "Limiter")]
pub struct Limiter {
    /// The core's limiter; None once closed.
    cell: std::sync::RwLock<Option<shardlimit::Limiter>>,
    completers: Arc<completion::Completers>,
    pub(crate) rates: convert::Rates,
    /// `transport="host"`: `acheck` of one policy moves its bytes on the asyncio loop
    host: Option<host::Slot>,
}

fn with_clock(
    limiter: shardlimit::Result<shardlimit::Limiter>,
    clock: Option<&ManualClock>,
) -> PyResult<Limiter> {
    let mut l = limiter.map_err(core_err)?;
    if let Some(c) = clock {
        l = l.with_clock(c.0.clone()).map_err(core_err)?;
    }
    logging::to_logging(&l);
    Ok(Limiter {
        cell: std::sync::RwLock::new(Some(l)),
        completers: Default::default(),
        rates: Default::default(),
        host: None,
    })
}

/// `limiter` with the transport `transport` names: "default" (the limiter's I/O thread)
/// or "host" (`acheck` of one policy on the asyncio loop itself, `host.rs`), which needs
/// every shard to be a standalone Redis over plain TCP (a ConfigError says which is not).
fn with_transport(mut limiter: Limiter, transport: &str) -> PyResult<Limiter> {
    match transport {
        "default" => Ok(limiter),
        "host" => {
            shardlimit::HostChecks::new(&limiter.inner()?).map_err(core_err)?;
            limiter.host = Some(Default::default());
            Ok(limiter)
        }
        other => Err(core_err(CoreError::InvalidArgument {
            what: "transport".into(),
            message: format!("must be \"default\" or \"host\", got {other:?}"),
        })),
    }
}

impl Limiter {
    /// The core's limiter (one reference more), or an error once closed.
    pub(crate) fn inner(&self) -> PyResult<shardlimit::Limiter> {
        self.cell
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                core_err(CoreError::InvalidArgument {
                    what: "limiter".into(),
                    message: "is closed".into(),
                })
            })
    }

    pub(crate) fn completers(&self) -> &Arc<completion::Completers> {
        &self.completers
    }

    /// Runs a blocking core call, releasing the GIL when it may wait on Redis.
    fn blocking<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&shardlimit::Limiter) -> shardlimit::Result<T> + Send,
    ) -> PyResult<T> {
        let l = &self.inner()?;
        if l.is_redis() {
            py.detach(|| f(l)).map_err(core_err)
        } else {
            f(l).map_err(core_err)
        }
    }
}

#[pymethods]
impl Limiter {
    /// A limiter on the in-memory engine with no named policies.
    #[staticmethod]
    #[pyo3(signature = (*, clock = None))]
    fn memory(clock: Option<&ManualClock>) -> PyResult<Limiter> {
        with_clock(Ok(shardlimit::Limiter::memory()), clock)
    }
    /// Parses a JSON config. Does not connect: connections are made on first use.
    #[staticmethod]
    #[pyo3(signature = (text, *, clock = None, transport = "default"))]
    fn from_json(text: &str, clock: Option<&ManualClock>, transport: &str) -> PyResult<Limiter> {
        with_transport(
            with_clock(shardlimit::Limiter::from_json(text), clock)?,
            transport,
        )
    }
    /// Loads a JSON config file.
    #[staticmethod]
    #[pyo3(signature = (path, *, clock = None, transport = "default"))]
    fn from_config(
        path: std::path::PathBuf,
        clock: Option<&ManualClock>,
        transport: &str,
    ) -> PyResult<Limiter> {
        with_transport(
            with_clock(shardlimit::Limiter::from_config_file(path), clock)?,
            transport,
        )
    }
    /// Uses `$SHARDLIMIT_CONFIG` (a path or inline JSON); the in-memory engine when unset.
    #[staticmethod]
    #[pyo3(signature = (*, clock = None))]
    fn from_env(clock: Option<&ManualClock>) -> PyResult<Limiter> {
        with_clock(shardlimit::Limiter::from_env(), clock)
    }

    /// True when Redis shards decide, False for the in-memory engine.
    #[getter]
    fn is_redis(&self) -> PyResult<bool> {
        Ok(self.inner()?.is_redis())
    }
    /// A number that changes whenever the config in force does (a `reload`, a watched
    /// file; the core's `config_generation`): what the middlewares' caches of policy facts
    /// are keyed by.
    #[getter]
    fn _config_generation(&self) -> PyResult<u64> {
        Ok(self.inner()?.config_generation())
    }
    /// The names of the configured policies.
    #[getter]
    fn policies(&self) -> PyResult<Vec<String>> {
        Ok(self.inner()?.config().policies.keys().cloned().collect())
    }
    /// The named policy of the config.
    fn policy(&self, name: &str) -> PyResult<Policy> {
        self.inner()?.policy(name).map(Policy).map_err(core_err)
    }
    /// The policy `policy` as plan `plan` of the config has it (the plan's limits under
    /// the policy's name, or the policy itself when the plan does not change it): check
    /// under a plan with `limiter.check(key, limiter.plan_policy("pro", "api"))`.
    fn plan_policy(&self, plan: &str, policy: &str) -> PyResult<Policy> {
        self.inner()?
            .plan_policy(plan, policy)
            .map(Policy)
            .map_err(core_err)
    }
    /// The shard `key` routes to, as (index, name); None on the in-memory engine.
    fn route(&self, key: &str) -> PyResult<Option<(u32, String)>> {
        Ok(self.inner()?.route(key).map(|(i, n)| (i, n.to_string())))
    }

    /// Checks `cost` units of `policy` (a name, a Policy or a Limit) for `key`.
    #[pyo3(signature = (key, policy, cost = None))]
    fn check(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        let ps = resolve_policies(self, policy)?;
        self.check_policies(py, key, ps, cost)
    }
    /// `check` in shadow mode for this one call: a check the limit would deny is allowed
    /// (`decision.shadow_denied`), consumes nothing and is counted for `shadow_report`.
    /// Block-list denials and `on_error` fallbacks are not shadowed.
    #[pyo3(signature = (key, policy, cost = None))]
    fn check_shadow(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        let ps = shadow::shadowed(&resolve_policies(self, policy)?)?;
        self.check_policies(py, key, ps, cost)
    }
    /// The shadow-mode denials of the policy named `policy` by key, summed over every
    /// shard (in memory: this process's counts), most first; `top` keeps that many keys:
    /// `{"policy", "total", "untracked", "keys": [{"key", "count"}]}`.
    #[pyo3(signature = (policy, top = None))]
    fn shadow_report(
        &self,
        py: Python<'_>,
        policy: String,
        top: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        let r = self.blocking(py, |l| l.shadow_report_blocking(&policy, top))?;
        shadow::report_obj(py, r)
    }
    /// `await limiter.acheck_shadow(...)`: `check_shadow` on asyncio.
    #[pyo3(signature = (key, policy, cost = None))]
    fn acheck_shadow<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let ps = shadow::shadowed(&resolve_policies(self, policy)?)?;
        self.acheck_policies(py, key, ps, cost)
    }
    /// `await limiter.ashadow_report(...)`.
    #[pyo3(signature = (policy, top = None))]
    fn ashadow_report<'py>(
        &self,
        py: Python<'py>,
        policy: String,
        top: Option<usize>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.shadow_report(&policy, top).await },
            shadow::report_obj,
        )
    }
    /// `key`'s state without consuming: would a check of one unit pass now?
    fn peek(&self, py: Python<'_>, key: String, policy: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let p = resolve_policy(self, policy)?;
        self.blocking(py, |l| l.peek_blocking(&key, &p))
            .map(Decision)
    }
    /// Acquires `units` of a concurrency policy: (decision, lease or None when denied).
    #[pyo3(signature = (key, policy, units = None))]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        units: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (r, p) = self.call_one(py, key, policy, units, |l, k, p, n| {
            l.acquire_blocking(k, p, n)
        })?;
        lease_pair(py, r, p)
    }
    /// Releases a lease. False when it was no longer held (released before, or expired).
    fn release(&self, py: Python<'_>, lease: &Lease) -> PyResult<bool> {
        let (policy, lease) = (lease.policy.clone(), lease.lease.clone());
        self.blocking(py, |l| {
            let me = l.clone();
            l.block_on(async move { me.release_with(&policy, &lease).await })
        })
    }
    /// Forgets `key`'s state under `policy`: its full budget is back.
    fn reset(&self, py: Python<'_>, key: String, policy: &Bound<'_, PyAny>) -> PyResult<()> {
        let ps = resolve_policies(self, policy)?;
        self.blocking(py, |l| {
            ps.iter().try_for_each(|p| l.reset_blocking(&key, p))
        })
    }
    /// A context manager holding `units` of a concurrency policy for the `with` block
    /// (`with` and `async with`); raises RateLimitExceeded when denied.
    #[pyo3(signature = (key, policy, units = None))]
    fn lease(
        slf: &Bound<'_, Self>,
        key: String,
        policy: &Bound<'_, PyAny>,
        units: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<LeaseContext> {
        let me = slf.get();
        Ok(LeaseContext {
            limiter: slf.clone().unbind(),
            key,
            policy: resolve_policy(me, policy)?,
            units: cost_arg(units)?,
            held: Mutex::new(None),
        })
    }

    /// A layered check: `layers` is a list of (key, policy) or (key, policy, cost). Allowed
    /// only if every layer allows; when any layer denies, no layer consumes.
    /// `decision.layer` is the index of the layer the decision describes.
    fn check_all(&self, py: Python<'_>, layers: &Bound<'_, PyAny>) -> PyResult<Decision> {
        let layers = layers_arg(self, layers)?;
        self.blocking(py, |l| l.check_all_blocking(&layers))
            .map(Decision)
    }
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

    /// `await limiter.acheck(...)`: `check` on asyncio, never blocking the event loop.
    #[pyo3(signature = (key, policy, cost = None))]
    fn acheck<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        let ps = resolve_policies(me, policy)?;
        if me.host.is_some() && ps.len() == 1 {
            return host::acheck(slf, key, ps, cost_arg(cost)?);
        }
        me.acheck_policies(py, key, ps, cost)
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
    /// `await limiter.aacquire(...)` -> (decision, lease or None).
    #[pyo3(signature = (key, policy, units = None))]
    fn aacquire<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        units: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            units,
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            |py, r, p| Ok(lease_pair(py, r, p)?.into_any().unbind()),
        )
    }
    /// Consumes `cost` units of `policy` for `key` without ever denying: the key may go
    /// into debt (capped at one limit) and later checks are denied until it is repaid.
    /// The decision is always allowed; `remaining` (0 in debt) describes the key after it.
    #[pyo3(signature = (key, policy, cost = None))]
    fn charge(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        self.call_one(py, key, policy, cost, |l, k, p, n| {
            l.charge_blocking(k, p, n)
        })
        .map(|(d, _)| Decision(d))
    }
    /// Gives `cost` units of `policy` back to `key`, never above its limit.
    #[pyo3(signature = (key, policy, cost = None))]
    fn refund(
        &self,
        py: Python<'_>,
        key: String,
        policy: &Bound<'_, PyAny>,
        cost: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Decision> {
        self.call_one(py, key, policy, cost, |l, k, p, n| {
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
    #[pyo3(signature = (key, policy, cost = None))]
    fn acharge<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            cost,
            |l, k, p, n| async move { l.charge(&k, &p, n).await },
            calls::decision_of,
        )
    }
    /// `await limiter.arefund(key, policy, cost)`.
    #[pyo3(signature = (key, policy, cost = None))]
    fn arefund<'py>(
        &self,
        py: Python<'py>,
        key: String,
        policy: &Bound<'py, PyAny>,
        cost: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.acall_one(
            py,
            key,
            policy,
            cost,
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

    /// Connects to every shard and loads the scripts within `timeout` seconds (its own
    /// budget, not a call's deadline), so that the first checks do not spend their deadline
    /// on a TCP connect and fall back. Raises the shard's error when one does not answer in
    /// time. Nothing to do in memory. The middlewares call it at start-up.
    #[pyo3(signature = (timeout = 5.0))]
    fn connect(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = ttl_arg(timeout)?;
        self.blocking(py, |l| l.connect_blocking(t))
    }
    /// `await limiter.aconnect(timeout)`: :meth:`connect` on asyncio.
    #[pyo3(signature = (timeout = 5.0))]
    fn aconnect<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let t = ttl_arg(timeout)?;
        let l = self.inner()?;
        self.completers.coroutine(
            py,
            &self.inner()?,
            async move { l.connect(t).await },
            |py, ()| Ok(py.None()),
        )
    }

    /// How many keys the in-memory engine holds; None on Redis.
    #[getter]
    fn memory_keys(&self) -> PyResult<Option<usize>> {
        Ok(self.inner()?.memory_keys())
    }

    /// Where the limiter's warning lines go (every fallback to `on_error`, a circuit
    /// opened, a failed handoff or refund, a rejected watched config; at most one per
    /// reason and policy or shard per the config's `log_interval`, each with how many
    /// were suppressed since the last). By default they are logged to
    /// `logging.getLogger("shardlimit")` at WARNING (ERROR for a rejected config), with
    /// the record's fields in `extra={"shardlimit": {...}}`. `callback(record)` receives
    /// them instead, as a dict (`level`, `target`, `reason`, `subject`, `error_kind`,
    /// `error`, `allowed`, `suppressed`, `message`); None drops them. Called on a thread
    /// of shardlimit's own (never the I/O thread), at most 1024 lines queued.
    fn set_log_sink(&self, callback: Option<Py<PyAny>>) -> PyResult<()> {
        logging::set_sink(&self.inner()?, callback);
        Ok(())
    }
    /// Calls `callback(event)` for every event (denials, blocks, fallbacks, circuit
    /// changes); `event` is a dict of strings with at least `"event"` (the kind) and the
    /// kind's fields (`policy`, `key`, `limit`, `retry_after_ms`, `error`, `allowed`,
    /// `shard`, `state`). Callbacks run on one thread per subscription, never on the I/O
    /// thread; at most 1024 events wait for a slow callback, later ones are dropped.
    /// An exception in the callback is reported as unraisable and the next event delivered.
    /// Not inherited by a forked child: subscribe again there. Once the interpreter exits
    /// (its `atexit` hooks), no callback is called again.
    fn subscribe(&self, callback: Py<PyAny>) -> PyResult<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<(&'static str, String)>>(1024);
        delivery::spawn("shardlimit-events", rx, move |py, fields| {
            let call = || -> PyResult<()> {
                let d = PyDict::new(py);
                for (k, v) in fields {
                    d.set_item(k, v)?;
                }
                callback.call1(py, (d,))?;
                Ok(())
            };
            if let Err(e) = call() {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        })?;
        self.inner()?
            .subscribe(Arc::new(move |e: &shardlimit::Event| {
                let _ = tx.try_send(e.fields());
            }));
        Ok(())
    }

    /// Applies a new config (JSON text or a dict) to the running limiter: connections and
    /// counters are kept where they still apply; a bad config raises and the old one stays.
    /// Returns what changed: `{"engine_changed", "handoff", "policies_added",
    /// "policies_removed", "policies_changed"}`.
    fn reload<'py>(
        &self,
        py: Python<'py>,
        config: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let text = config_text(py, config)?;
        let cfg = shardlimit::Config::from_json(&text).map_err(core_err)?;
        let l = self.inner()?;
        let r = py.detach(|| l.reload(cfg)).map_err(core_err)?;
        reload_report(py, r)
    }
    /// `reload` from a config file.
    fn reload_from_file<'py>(
        &self,
        py: Python<'py>,
        path: std::path::PathBuf,
    ) -> PyResult<Bound<'py, PyDict>> {
        let l = self.inner()?;
        let r = py.detach(|| l.reload_from_file(path)).map_err(core_err)?;
        reload_report(py, r)
    }
    /// Reloads whenever `path` changes (its modification time is polled every `every`
    /// seconds); a bad new config is logged and ignored. Watches until the returned
    /// watcher is stopped (`stop()`, or the end of its `with` block) or collected.
    #[pyo3(signature = (path, every = 1.0))]
    fn watch_config(&self, path: std::path::PathBuf, every: f64) -> PyResult<ConfigWatcher> {
        let every = ttl_arg(every)?;
        if every.is_zero() {
            return Err(core_err(CoreError::InvalidArgument {
                what: "every".into(),
                message: "must be above 0 seconds".into(),
            }));
        }
        Ok(ConfigWatcher(Mutex::new(Some(
            self.inner()?.watch_config(path, every),
        ))))
    }

    /// Scales limits by `factor` (0 < factor <= 1): every policy when `policies` is empty,
    /// else the named ones. Decisions and headers report the effective limit.
    #[pyo3(signature = (factor, policies = Vec::new()))]
    fn set_scale(&self, factor: f64, policies: Vec<String>) -> PyResult<()> {
        let names: Vec<&str> = policies.iter().map(String::as_str).collect();
        self.inner()?.set_scale(factor, &names).map_err(core_err)
    }
    /// The global scale factor in force (policies may have their own on top).
    fn scale(&self) -> PyResult<f64> {
        Ok(self.inner()?.scale())
    }
    /// Installs the core's latency hook for `observe_health`: full limits while the
    /// signal (seconds, e.g. a dependency's p99) is at or under `target`, `target / signal`
    /// above it, never below `min_factor`.
    #[pyo3(signature = (target, min_factor = 0.1))]
    fn set_latency_scale(&self, target: f64, min_factor: f64) -> PyResult<()> {
        let target = ttl_arg(target)?;
        self.inner()?
            .set_scale_hook(shardlimit::latency_scale(target, min_factor));
        Ok(())
    }
    /// Feeds a health signal to the scale hook (`set_latency_scale`) and applies the
    /// factor it returns; returns the factor now in force.
    fn observe_health(&self, signal: f64) -> PyResult<f64> {
        self.inner()?.observe_health(signal).map_err(core_err)
    }

    /// Counters per policy (`allowed`, `denied`, `fallback`, `blocked`, `local_admitted`,
    /// `redis_errors`), the Redis latency histogram and dropped events, as a dict.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.inner()?.metrics();
        let d = PyDict::new(py);
        let policies = PyList::empty(py);
        for p in &m.policies {
            let pd = PyDict::new(py);
            pd.set_item("policy", &p.policy)?;
            pd.set_item("allowed", p.allowed)?;
            pd.set_item("denied", p.denied)?;
            pd.set_item("fallback", p.fallback)?;
            pd.set_item("blocked", p.blocked)?;
            pd.set_item("local_admitted", p.local_admitted)?;
            pd.set_item("redis_errors", p.redis_errors)?;
            pd.set_item("shadow_denied", p.shadow_denied)?;
            pd.set_item("near_limit", p.near_limit)?;
            policies.append(pd)?;
        }
        d.set_item("policies", policies)?;
        let lat = PyDict::new(py);
        lat.set_item(
            "bucket_bounds_us",
            shardlimit::metrics::LATENCY_BUCKETS_US.to_vec(),
        )?;
        lat.set_item("buckets", m.redis_latency.buckets.clone())?;
        lat.set_item("sum_us", m.redis_latency.sum_us)?;
        lat.set_item("count", m.redis_latency.count)?;
        d.set_item("redis_latency", lat)?;
        d.set_item("events_dropped", m.events_dropped)?;
        Ok(d)
    }
    /// The metrics in the Prometheus text exposition format (0.0.4), for a `/metrics` route.
    fn prometheus(&self) -> PyResult<String> {
        Ok(self.inner()?.metrics().to_prometheus())
    }

    /// Closes the limiter: its connections and I/O runtime are let go once the calls in
    /// flight finish; every later call raises InvalidArgumentError. Idempotent. Also the
    /// end of a `with limiter:` block.
    fn close(&self, py: Python<'_>) {
        if let Some(h) = &self.host {
            h.close(py);
        }
        let l = self.cell.write().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(l));
    }
    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.cell
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let Ok(l) = self.inner() else {
            return "Limiter(closed)".into();
        };
        format!(
            "Limiter(engine={:?}, policies={:?})",
            if l.is_redis() { "redis" } else { "memory" },
            l.config().policies.keys().collect::<Vec<_>>()
        )
    }
}

/// The layers of a check of several limits (a rate string such as "10/second; 100/minute")
/// on one key: one atomic layered check.
fn same_key(key: &str, ps: &[shardlimit::Policy], cost: u64) -> Vec<shardlimit::Layer> {
    ps.iter()
        .map(|p| shardlimit::Layer::new(key.to_string(), p, cost))
        .collect()
}

/// A config argument: JSON text, or a dict (serialised with `json.dumps`).
fn config_text(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(s) = config.cast::<pyo3::types::PyString>() {
        return Ok(s.to_cow()?.into_owned());
    }
    if config.is_instance_of::<PyDict>() {
        return py
            .import("json")?
            .call_method1("dumps", (config,))?
            .extract();
    }
    Err(pyo3::exceptions::PyTypeError::new_err(format!(
        "config must be JSON text (str) or a dict, not {}",
        config.get_type().name()?
    )))
}

fn reload_report(py: Python<'_>, r: shardlimit::ReloadReport) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("engine_changed", r.engine_changed)?;
    d.set_item("handoff", r.handoff)?;
    d.set_item("policies_added", r.policies_added)?;
    d.set_item("policies_removed", r.policies_removed)?;
    d.set_item("policies_changed", r.policies_changed)?;
    Ok(d)
}

/// Watches a config file for `Limiter.watch_config`; `stop()` (or leaving its `with`
/// block) ends the watch.
#[pyclass(frozen, module = "shardlimit", name = "ConfigWatcher")]
pub struct ConfigWatcher(Mutex<Option<shardlimit::ConfigWatcher>>);

#[pymethods]
impl ConfigWatcher {
    /// Stops watching (waits for the polling thread to finish). Idempotent.
    fn stop(&self, py: Python<'_>) {
        let w = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(w));
    }
    /// True until stopped.
    #[getter]
    fn active(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }
}

/// `with limiter.lease(key, policy):` / `async with ...`: acquires on entry (raising
/// RateLimitExceeded when denied), releases on exit.
#[pyclass(frozen, module = "shardlimit", name = "LeaseContext")]
pub struct LeaseContext {
    limiter: Py<Limiter>,
    key: String,
    policy: shardlimit::Policy,
    units: u64,
    held: Mutex<Option<(shardlimit::Lease, shardlimit::Policy)>>,
}

impl LeaseContext {
    fn take_held(&self) -> Option<(shardlimit::Lease, shardlimit::Policy)> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Turns an acquire result into the entered Lease, or RateLimitExceeded when denied.
fn entered(
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
    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let limiter = me.limiter.get();
        let (key, policy, units) = (me.key.clone(), me.policy.clone(), me.units);
        let r = limiter.blocking(py, |l| l.acquire_blocking(&key, &policy, units))?;
        entered(py, &slf.clone().unbind(), r)
    }
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        if let Some((lease, policy)) = self.take_held() {
            self.limiter.get().blocking(py, |l| {
                let me = l.clone();
                l.block_on(async move { me.release_with(&policy, &lease).await })
            })?;
        }
        Ok(false)
    }
    fn __aenter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
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
    fn __aexit__<'py>(
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

/// Every core error kind as (code, name), in code order: the exception table is tested
/// against it.
fn error_kinds(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    PyList::new(py, ErrorKind::ALL.iter().map(|k| (k.code(), k.name())))
}

#[pymodule]
fn _shardlimit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", shardlimit::VERSION)?;
    m.add("ERROR_KINDS", error_kinds(m.py())?)?;
    m.add(
        "BACKEND_ERROR_KINDS",
        ErrorKind::ALL
            .iter()
            .filter(|k| k.is_backend())
            .map(|k| k.name())
            .collect::<Vec<_>>(),
    )?;
    m.add_class::<Decision>()?;
    m.add_class::<Limit>()?;
    m.add_class::<Policy>()?;
    m.add_class::<Lease>()?;
    m.add_class::<settle::Reservation>()?;
    m.add_class::<LeaseContext>()?;
    m.add_class::<ManualClock>()?;
    m.add_class::<BlockInfo>()?;
    m.add_class::<TrustedProxies>()?;
    m.add_function(wrap_pyfunction!(client_ip, m)?)?;
    m.add_function(wrap_pyfunction!(ip_key, m)?)?;
    m.add_function(wrap_pyfunction!(parse_rate, m)?)?;
    m.add_class::<ConfigWatcher>()?;
    m.add_class::<Limiter>()?;
    m.add_class::<host::HostChecks>()?;
    delivery::register(m)?;
    Ok(())
}

// The system allocator, not mimalloc: mimalloc takes the thread that first loads it for the
// process's main thread and gives it a static heap, which it tears down when that thread
// exits; glibc then reuses the thread's descriptor for the next thread, which mimalloc takes
// for the main thread again and hands the dead heap (a segfault on the first allocation).
// Importing shardlimit on a thread that exits, then using it from another, did exactly
// that (tests/test_threads.py).
