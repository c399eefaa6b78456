//! The native limiter: construction, the config in force, routing, connecting, closing.

use super::*;

/// A clock that moves only when told to, for deterministic tests and replays.
#[napi]
pub struct ManualClock {
    pub(crate) inner: Arc<shardlimit::ManualClock>,
}

#[napi]
impl ManualClock {
    /// A clock reading `startUs` microseconds since the Unix epoch (0 by default).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, start_us: Option<f64>) -> Result<Self> {
        let us = units("startUs", start_us.unwrap_or(0.0)).map_err(|e| core_error(&env, e))?;
        Ok(ManualClock {
            inner: shardlimit::ManualClock::new(us),
        })
    }
    /// Sets the time, in microseconds since the Unix epoch.
    #[napi(catch_unwind)]
    pub fn set_us(&self, env: Env, us: f64) -> Result<()> {
        let us = units("us", us).map_err(|e| core_error(&env, e))?;
        self.inner.set_us(us);
        Ok(())
    }
    /// Moves the time forward by `us` microseconds.
    #[napi(catch_unwind)]
    pub fn advance_us(&self, env: Env, us: f64) -> Result<()> {
        let us = units("us", us).map_err(|e| core_error(&env, e))?;
        self.inner.advance_us(us);
        Ok(())
    }
    /// The time, in microseconds since the Unix epoch.
    #[napi(getter, catch_unwind)]
    pub fn now_us(&self) -> f64 {
        use shardlimit::Clock;
        self.inner.now_us() as f64
    }
}

/// The native limiter; `index.js` wraps it with argument checks.
#[napi]
pub struct NativeLimiter {
    pub(crate) inner: shardlimit::Limiter,
}

pub(crate) fn with_clock(
    limiter: shardlimit::Limiter,
    clock: Option<&ManualClock>,
) -> shardlimit::Result<shardlimit::Limiter> {
    match clock {
        Some(c) => limiter.with_clock(c.inner.clone()),
        None => Ok(limiter),
    }
}

/// Where a key routes.
#[napi(object)]
pub struct ShardRoute {
    pub index: u32,
    pub name: String,
}

#[napi]
impl NativeLimiter {
    #[napi(factory, catch_unwind)]
    pub fn from_json(env: Env, text: String, clock: Option<&ManualClock>) -> Result<Self> {
        guarded(|| with_clock(shardlimit::Limiter::from_json(&text)?, clock))
            .map(|inner| NativeLimiter { inner })
            .map_err(|e| core_error(&env, e))
    }

    #[napi(factory, catch_unwind)]
    pub fn from_config(env: Env, path: String, clock: Option<&ManualClock>) -> Result<Self> {
        guarded(|| with_clock(shardlimit::Limiter::from_config_file(&path)?, clock))
            .map(|inner| NativeLimiter { inner })
            .map_err(|e| core_error(&env, e))
    }

    #[napi(factory, catch_unwind)]
    pub fn memory(env: Env, clock: Option<&ManualClock>) -> Result<Self> {
        guarded(|| with_clock(shardlimit::Limiter::memory(), clock))
            .map(|inner| NativeLimiter { inner })
            .map_err(|e| core_error(&env, e))
    }

    // ----- the rest of the core's surface (kept apart from the check path) -------------

    /// `$SHARDLIMIT_CONFIG` (a path, or inline JSON); the in-memory engine when unset.
    #[napi(factory, catch_unwind)]
    pub fn from_env(env: Env, clock: Option<&ManualClock>) -> Result<Self> {
        guarded(|| with_clock(shardlimit::Limiter::from_env()?, clock))
            .map(|inner| NativeLimiter { inner })
            .map_err(|e| core_error(&env, e))
    }

    /// True when Redis shards decide, false for the in-memory engine.
    #[napi(getter)]
    pub fn is_redis(&self) -> bool {
        self.inner.is_redis()
    }

    /// The names of the configured policies.
    #[napi(getter)]
    pub fn policies(&self) -> Vec<String> {
        self.inner.config().policies.keys().cloned().collect()
    }

    /// The shard `key` routes to, or null on the in-memory engine.
    #[napi(catch_unwind)]
    pub fn route(&self, key: String) -> Option<ShardRoute> {
        self.inner.route(&key).map(|(index, name)| ShardRoute {
            index,
            name: name.to_string(),
        })
    }

    /// Connects to every shard and loads the scripts within `timeout_ms` (its own budget,
    /// not a call's deadline); rejects with the shard's error when one does not answer.
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn connect(&self, env: Env, timeout_ms: f64) -> Result<Unknown<'static>> {
        if !(timeout_ms.is_finite() && timeout_ms > 0.0 && timeout_ms <= 3_600_000.0) {
            return Err(core_error(
                &env,
                invalid(
                    "timeoutMs",
                    "must be a number of milliseconds above 0, at most 1 hour",
                ),
            ));
        }
        let me = self.inner.clone();
        let timeout = std::time::Duration::from_micros((timeout_ms * 1000.0).round() as u64);
        promise(
            &env,
            &self.inner,
            async move { me.connect(timeout).await },
            |_, ()| Ok(()),
        )
    }

    /// Lets go of the engine: its connections and I/O thread end once the calls in flight
    /// (which hold their own reference) have finished. The JS wrapper refuses later calls.
    #[napi(catch_unwind)]
    pub fn close(&mut self) {
        let engine = std::mem::replace(&mut self.inner, shardlimit::Limiter::memory());
        // the I/O thread is joined when the last reference goes: never on the JS thread
        std::thread::Builder::new()
            .name("shardlimit-close".into())
            .spawn(move || drop(engine))
            .ok();
    }

    /// How many reloads are in force (0 at first; the core's `config_generation`).
    #[napi(getter)]
    pub fn config_generation(&self) -> f64 {
        self.inner.config_generation() as f64
    }

    /// Keys held by the in-memory engine; null on Redis.
    #[napi(getter)]
    pub fn memory_keys(&self) -> Option<f64> {
        self.inner.memory_keys().map(|n| n as f64)
    }

    /// A configured policy: name, algorithm, parameters, failure mode.
    #[napi(catch_unwind, ts_return_type = "PolicyInfo")]
    pub fn policy_info(&self, env: Env, name: String) -> Result<serde_json::Value> {
        guarded(|| self.inner.policy(&name))
            .map(|p| policy_json(&p))
            .map_err(|e| core_error(&env, e))
    }

    /// The configuration in force, without shard URLs (they may carry passwords).
    #[napi(catch_unwind, ts_return_type = "ConfigInfo")]
    pub fn config_info(&self) -> serde_json::Value {
        let c = self.inner.config();
        let shards: Vec<String> = match &c.shards {
            Some(s) => s.iter().map(|s| s.name.clone()).collect(),
            None => Vec::new(),
        };
        serde_json::json!({
            "engine": if self.inner.is_redis() { "redis" } else { "memory" },
            "shards": shards,
            "cluster": c.cluster.as_ref().map(|n| n.len()),
            "keyPrefix": c.key_prefix,
            "timeoutMs": ms(c.timeout),
            "onError": c.on_error.name(),
            "instances": c.instances,
            "policies": c.policies.values().map(policy_json).collect::<Vec<_>>(),
        })
    }
}
