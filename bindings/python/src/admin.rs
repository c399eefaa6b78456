//! Running a limiter: reload and config watching, scaling, metrics.

use super::*;

/// A config argument: JSON text, or a dict (serialised with `json.dumps`).
pub(crate) fn config_text(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<String> {
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

pub(crate) fn reload_report(
    py: Python<'_>,
    r: shardlimit::ReloadReport,
) -> PyResult<Bound<'_, PyDict>> {
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
pub struct ConfigWatcher(pub(crate) Mutex<Option<shardlimit::ConfigWatcher>>);

#[pymethods]
impl ConfigWatcher {
    /// Stops watching (waits for the polling thread to finish). Idempotent.
    pub(crate) fn stop(&self, py: Python<'_>) {
        let w = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(w));
    }
    /// True until stopped.
    #[getter]
    pub(crate) fn active(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
    pub(crate) fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    #[pyo3(signature = (*_exc))]
    pub(crate) fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }
}

#[pymethods]
impl Limiter {
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
    /// The metrics in the Prometheus text exposition format (0.0.4), for a `/metrics` route:
    /// `metrics()` is this text in every language (spec/names.json).
    fn metrics(&self) -> PyResult<String> {
        Ok(self.inner()?.metrics().to_prometheus())
    }
    /// Counters per policy (`allowed`, `denied`, `fallback`, `blocked`, `local_admitted`,
    /// `redis_errors`), the Redis latency histogram and dropped events, as a dict.
    fn metrics_snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
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
    /// The same as `metrics()` (its earlier name, kept for existing code).
    fn prometheus(&self) -> PyResult<String> {
        Ok(self.inner()?.metrics().to_prometheus())
    }
}
