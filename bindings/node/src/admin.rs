//! Running a limiter: scaling, reload and config watching, metrics.

use super::*;

/// A config-file watcher from `watchConfig`; `close()` stops it.
#[napi]
pub struct NativeWatcher {
    pub(crate) inner: Option<shardlimit::ConfigWatcher>,
}

#[napi]
impl NativeWatcher {
    /// Stops watching (the polling thread ends within one interval, off the JS thread).
    #[napi(catch_unwind)]
    pub fn close(&mut self) {
        if let Some(w) = self.inner.take() {
            std::thread::Builder::new()
                .name("shardlimit-unwatch".into())
                .spawn(move || drop(w))
                .ok();
        }
    }
}

/// What a reload changed.
#[napi(object)]
pub struct ReloadReport {
    pub engine_changed: bool,
    pub handoff: bool,
    pub policies_added: Vec<String>,
    pub policies_removed: Vec<String>,
    pub policies_changed: Vec<String>,
}

impl From<shardlimit::ReloadReport> for ReloadReport {
    fn from(r: shardlimit::ReloadReport) -> Self {
        ReloadReport {
            engine_changed: r.engine_changed,
            handoff: r.handoff,
            policies_added: r.policies_added,
            policies_removed: r.policies_removed,
            policies_changed: r.policies_changed,
        }
    }
}

#[napi]
impl NativeLimiter {
    /// Scales limits by `factor` (0 < factor <= 1): all policies, or the named ones.
    #[napi(catch_unwind)]
    pub fn set_scale(&self, env: Env, factor: f64, policies: Vec<String>) -> Result<()> {
        let names: Vec<&str> = policies.iter().map(String::as_str).collect();
        guarded(|| self.inner.set_scale(factor, &names)).map_err(|e| core_error(&env, e))
    }

    /// The global scale factor in force.
    #[napi(getter)]
    pub fn scale(&self) -> f64 {
        self.inner.scale()
    }

    /// Feeds the observed latency (ms) to the latency scale hook; returns the factor now
    /// in force. (The core's hook takes seconds; JS speaks milliseconds.)
    #[napi(catch_unwind)]
    pub fn observe_health(&self, env: Env, latency_ms: f64) -> Result<f64> {
        guarded(|| self.inner.observe_health(latency_ms / 1000.0)).map_err(|e| core_error(&env, e))
    }

    /// Installs the core's latency scale hook: full limits while the signal (ms) is at or
    /// under `targetMs`, proportionally less above it, never below `minFactor`.
    #[napi(catch_unwind)]
    pub fn set_latency_scale(&self, target_ms: f64, min_factor: f64) {
        let target = Duration::from_secs_f64((target_ms / 1000.0).clamp(0.0, 1e9));
        self.inner
            .set_scale_hook(shardlimit::latency_scale(target, min_factor));
    }

    /// Applies a new JSON config: in-flight calls finish on the old one. Returns what changed.
    #[napi(catch_unwind)]
    pub fn reload(&self, env: Env, text: String) -> Result<ReloadReport> {
        guarded(|| self.inner.reload(shardlimit::Config::from_json(&text)?))
            .map(ReloadReport::from)
            .map_err(|e| core_error(&env, e))
    }

    /// Reads, validates and applies a config file; a bad file leaves the old config in force.
    #[napi(catch_unwind)]
    pub fn reload_from_file(&self, env: Env, path: String) -> Result<ReloadReport> {
        guarded(|| self.inner.reload_from_file(&path))
            .map(ReloadReport::from)
            .map_err(|e| core_error(&env, e))
    }

    /// Reloads whenever `path` changes (polled every `everyMs`); a bad file is ignored and
    /// the old config stays. Stops when the returned watcher is closed or collected.
    #[napi(catch_unwind)]
    pub fn watch_config(&self, path: String, every_ms: f64) -> NativeWatcher {
        let every = Duration::from_micros((every_ms.clamp(1.0, 3_600_000.0) * 1000.0) as u64);
        NativeWatcher {
            inner: Some(self.inner.watch_config(path, every)),
        }
    }

    /// Counters per policy and the Redis latency histogram, in Prometheus text format.
    #[napi(catch_unwind)]
    pub fn metrics_prometheus(&self) -> String {
        self.inner.metrics().to_prometheus()
    }

    /// Counters per policy and the Redis latency histogram, as an object.
    #[napi(catch_unwind, ts_return_type = "MetricsSnapshot")]
    pub fn metrics_snapshot(&self) -> serde_json::Value {
        let m = self.inner.metrics();
        let policies: Vec<_> = m
            .policies
            .iter()
            .map(|p| {
                serde_json::json!({
                    "policy": p.policy,
                    "allowed": p.allowed,
                    "denied": p.denied,
                    "fallback": p.fallback,
                    "blocked": p.blocked,
                    "localAdmitted": p.local_admitted,
                    "redisErrors": p.redis_errors,
                    "shadowDenied": p.shadow_denied,
                    "nearLimit": p.near_limit,
                })
            })
            .collect();
        serde_json::json!({
            "policies": policies,
            "redisLatency": {
                "bucketsUs": shardlimit::metrics::LATENCY_BUCKETS_US,
                "counts": m.redis_latency.buckets,
                "sumUs": m.redis_latency.sum_us,
                "count": m.redis_latency.count,
            },
            "eventsDropped": m.events_dropped,
        })
    }
}
