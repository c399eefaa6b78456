//! The `Limiter` class: construction, the config's policies, connecting, closing.

use super::*;

/// A rate limiter: a config, an engine (Redis shards or in-memory) and its own I/O runtime.
/// Thread-safe, fork-safe; share one per process.
#[pyclass(frozen, module = "shardlimit", name = "Limiter")]
pub struct Limiter {
    /// The core's limiter; None once closed.
    pub(crate) cell: std::sync::RwLock<Option<shardlimit::Limiter>>,
    pub(crate) completers: Arc<completion::Completers>,
    pub(crate) rates: convert::Rates,
    /// `transport="host"`: `acheck` of one policy moves its bytes on the asyncio loop
    pub(crate) host: Option<host::Slot>,
}

pub(crate) fn with_clock(
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

/// `limiter` with the transport `transport` names: "host" (`acheck` of one policy on the
/// asyncio loop itself, `host.rs`), which needs every shard to be a standalone Redis over
/// plain TCP (a ConfigError says which is not); "thread" (the limiter's I/O thread); or
/// "default": the host transport where it serves the limiter's shards, else the I/O thread
/// (measured: docs/notes/2026-12-measurements.md, "The default transport").
/// Sync calls always take the calling thread's path: the transport is `acheck`'s.
pub(crate) fn with_transport(mut limiter: Limiter, transport: &str) -> PyResult<Limiter> {
    match transport {
        "thread" => Ok(limiter),
        "host" => {
            shardlimit::HostChecks::new(&limiter.inner()?).map_err(core_err)?;
            limiter.host = Some(Default::default());
            Ok(limiter)
        }
        "default" => {
            // (not for in-memory, TLS, Sentinel, Cluster or Unix-socket limiters: a config
            // error says so, and the I/O thread serves them)
            match shardlimit::HostChecks::new(&limiter.inner()?) {
                Ok(_) => limiter.host = Some(Default::default()),
                Err(CoreError::Config { .. }) => {}
                Err(e) => return Err(core_err(e)),
            }
            Ok(limiter)
        }
        other => Err(core_err(CoreError::InvalidArgument {
            what: "transport".into(),
            message: format!("must be \"default\", \"host\" or \"thread\", got {other:?}"),
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
    pub(crate) fn blocking<T: Send>(
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
    /// Loads a JSON config file (the name of spec/names.json: `from_config_file` in
    /// every language's idiom).
    #[staticmethod]
    #[pyo3(signature = (path, *, clock = None, transport = "default"))]
    fn from_config_file(
        path: std::path::PathBuf,
        clock: Option<&ManualClock>,
        transport: &str,
    ) -> PyResult<Limiter> {
        with_transport(
            with_clock(shardlimit::Limiter::from_config_file(path), clock)?,
            transport,
        )
    }
    /// The same as `from_config_file` (its earlier name, kept for existing code).
    #[staticmethod]
    #[pyo3(signature = (path, *, clock = None, transport = "default"))]
    fn from_config(
        path: std::path::PathBuf,
        clock: Option<&ManualClock>,
        transport: &str,
    ) -> PyResult<Limiter> {
        Self::from_config_file(path, clock, transport)
    }
    /// Uses `$SHARDLIMIT_CONFIG` (a path or inline JSON); the in-memory engine when unset.
    #[staticmethod]
    #[pyo3(signature = (*, clock = None, transport = "default"))]
    fn from_env(clock: Option<&ManualClock>, transport: &str) -> PyResult<Limiter> {
        with_transport(
            with_clock(shardlimit::Limiter::from_env(), clock)?,
            transport,
        )
    }
    /// Which transport carries `acheck` of one policy: "host" (the running asyncio loop)
    /// or "thread" (the limiter's I/O thread; also every in-memory limiter's answer).
    #[getter]
    fn transport(&self) -> &'static str {
        if self.host.is_some() {
            "host"
        } else {
            "thread"
        }
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
