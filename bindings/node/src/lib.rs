//! The Node.js binding of shardlimit: a thin napi-rs skin over the core.
//!
//! This file only converts types and errors. Argument *type* checks (TypeError) are done by
//! the JavaScript wrapper in `index.js`; values are validated by the core.
//!
//! Async calls: on the Redis engine, each call is spawned on the core's own Tokio runtime
//! (`Limiter::spawner`, which starts the calls of a burst together so their commands leave
//! in one write); its Promise is settled from there through the environment's
//! batched settle queue (`settle.rs`: one threadsafe function per environment, one event-loop
//! wake-up for many Promises), so the event loop never waits and no thread is started per
//! call. On the in-memory engine
//! the call never waits, so it runs to completion at once and the Promise is returned
//! already settled.
//!
//! Errors: every core error becomes a JS error built by the factory that `index.js`
//! registers per environment (`setErrorFactory`), so a rejection is an instance of the
//! error subclass for its `ErrorKind`, with a stable `code`. Panics are caught and become
//! `ERR_SHARDLIMIT_INTERNAL` errors: nothing unwinds into Node.

#![deny(clippy::all)]
// the core's check futures nest deeply (layers, fallback, handoff): rustc needs room to lay them out
#![recursion_limit = "256"]

use napi::bindgen_prelude::*;
use napi::sys;
use napi::threadsafe_function::ThreadsafeFunctionCallMode;
use napi_derive::napi;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

mod calls;
pub mod decision;
mod host;
mod logging;
mod reserve;
mod settle;

use decision::Decision;

/// The JS function `(kindName, message) => Error` that `index.js` registers in each
/// environment (main thread and every worker).
type ErrorFactory = FunctionRef<FnArgs<(String, String)>, Unknown<'static>>;

/// What the addon keeps per environment (napi instance data).
struct EnvData {
    factory: Option<ErrorFactory>,
    settler: Option<settle::Settler>,
    /// `index.js`'s `Decision` class (`decision.rs`)
    decision_class: Option<sys::napi_ref>,
}

fn env_data(env: &Env) -> Option<&'static mut EnvData> {
    env.get_instance_data::<EnvData>().ok().flatten()
}

fn env_data_or_init(env: &Env) -> Result<&'static mut EnvData> {
    if env_data(env).is_none() {
        let data = EnvData {
            factory: None,
            settler: Some(settle::Settler::new(env)?),
            decision_class: None,
        };
        env.set_instance_data(data, (), |_| {})?;
    }
    env_data(env).ok_or_else(|| Error::from_reason("shardlimit: no instance data"))
}

fn core_error(env: &Env, e: shardlimit::Error) -> Error {
    let kind = e.kind().name().to_string();
    let message = e.to_string();
    if let Some(factory) = env_data(env).and_then(|d| d.factory.as_ref()) {
        if let Ok(f) = factory.borrow_back(env) {
            if let Ok(obj) = f.call(FnArgs::from((kind.clone(), message.clone()))) {
                return Error::from(obj);
            }
        }
    }
    // no factory (the addon used without index.js): a plain Error whose `code` is the kind
    Error::new(
        Status::GenericFailure,
        format!("[{}] {message}", code_of(&kind)),
    )
}

fn code_of(kind_name: &str) -> String {
    format!("ERR_SHARDLIMIT_{}", kind_name.to_ascii_uppercase())
}

fn panic_error(payload: Box<dyn std::any::Any + Send>) -> shardlimit::Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    shardlimit::Error::Internal(format!("panic: {what}"))
}

fn invalid(what: &str, message: &str) -> shardlimit::Error {
    shardlimit::Error::InvalidArgument {
        what: what.to_string(),
        message: message.to_string(),
    }
}

/// A JS number that must be a whole number of units (the wrapper has type-checked it).
fn units(what: &str, n: f64) -> shardlimit::Result<u64> {
    if n.is_finite() && n >= 0.0 && n.fract() == 0.0 && n <= 9_007_199_254_740_991.0 {
        Ok(n as u64)
    } else {
        Err(invalid(what, "must be a non-negative safe integer"))
    }
}

fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Runs `f`, turning a panic into an internal error.
fn guarded<T>(f: impl FnOnce() -> shardlimit::Result<T>) -> shardlimit::Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(p)))
}

/// A future that turns a panic while polling into an internal error. It holds the future
/// itself (no box of its own: the task that polls it is one allocation already).
struct CatchUnwind<F>(F);

impl<T, F: Future<Output = shardlimit::Result<T>>> Future for CatchUnwind<F> {
    type Output = shardlimit::Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning: the inner future is never moved out of `self`, and
        // CatchUnwind implements neither Drop nor Unpin by hand.
        let fut = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(p) => p,
            Err(payload) => Poll::Ready(Err(panic_error(payload))),
        }
    }
}

/// A Promise settled now with `result` (converted on this thread).
fn settled<V: ToNapiValue>(env: &Env, result: Result<V>) -> Result<Unknown<'static>> {
    let raw_env = env.raw();
    let mut deferred = std::ptr::null_mut();
    let mut promise = std::ptr::null_mut();
    // SAFETY: plain napi calls on the calling (JS) thread with its env.
    unsafe {
        check_status!(sys::napi_create_promise(
            raw_env,
            &mut deferred,
            &mut promise
        ))?;
        match result.and_then(|v| V::to_napi_value(raw_env, v)) {
            Ok(value) => check_status!(sys::napi_resolve_deferred(raw_env, deferred, value))?,
            Err(e) => {
                let err = JsError::from(e).into_value(raw_env);
                check_status!(sys::napi_reject_deferred(raw_env, deferred, err))?
            }
        }
        Ok(Unknown::from_raw_unchecked(raw_env, promise))
    }
}

/// Turns a core future into a Promise (see the module docs).
/// An override as JS sees it: `{ key, policy, limit: {...}, remainingMs: number | null }`,
/// and `limits: [{...}, ...]` when it holds several (`limit` is then the first).
fn override_js(info: &shardlimit::OverrideInfo) -> serde_json::Value {
    let v = info.to_json();
    let mut js = serde_json::json!({
        "key": v["key"],
        "policy": v["policy"],
        "limit": v["limit"],
        "remainingMs": v["remaining_ms"],
    });
    if let Some(all) = v.get("limits") {
        js["limits"] = all.clone();
    }
    js
}

fn promise<T, V, F, C>(
    env: &Env,
    limiter: &shardlimit::Limiter,
    fut: F,
    convert: C,
) -> Result<Unknown<'static>>
where
    T: Send + 'static,
    V: ToNapiValue + 'static,
    F: Future<Output = shardlimit::Result<T>> + Send + 'static,
    C: FnOnce(&Env, T) -> Result<V> + Send + 'static,
{
    let spawner = match guarded(|| limiter.spawner()) {
        Ok(h) => h,
        Err(e) => return settled::<V>(env, Err(core_error(env, e))),
    };
    match spawner {
        Some(spawner) => {
            let settler = env_data_or_init(env)?
                .settler
                .as_ref()
                .ok_or_else(|| Error::from_reason("shardlimit: no settler"))?;
            let (deferred, promise) = settler.create(env)?;
            let sender = settler.sender();
            spawner.spawn(async move {
                let result = CatchUnwind(fut).await;
                sender.send(Box::new(move |raw_env| {
                    let env = Env::from_raw(raw_env);
                    let value = match result {
                        // SAFETY: on the JS thread of `raw_env` (settle jobs run there).
                        Ok(v) => {
                            convert(&env, v).and_then(|v| unsafe { V::to_napi_value(raw_env, v) })
                        }
                        Err(e) => Err(core_error(&env, e)),
                    };
                    // SAFETY: JS thread; each deferred is settled once.
                    unsafe { settle::settle(raw_env, deferred, value) }
                }));
            });
            // SAFETY: the promise object belongs to `env` and is returned to JS at once.
            Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), promise) })
        }
        None => {
            // the in-memory engine never waits: run to completion now
            let fut = CatchUnwind(fut);
            let result = guarded(|| limiter.block_on(fut));
            let converted = match result {
                Ok(v) => convert(env, v),
                Err(e) => Err(core_error(env, e)),
            };
            settled(env, converted)
        }
    }
}

/// Registers the JS error factory of this environment. Called once by `index.js`.
#[napi(catch_unwind)]
pub fn set_error_factory(
    env: Env,
    factory: Function<FnArgs<(String, String)>, Unknown<'static>>,
) -> Result<()> {
    let r = factory.create_ref()?;
    env_data_or_init(&env)?.factory = Some(r);
    Ok(())
}

/// One stable error kind of the core.
#[napi(object)]
pub struct ErrorKindInfo {
    /// The stable snake_case name (`config`, `timeout`, ...).
    pub name: String,
    /// The stable numeric code (the C binding's result code).
    pub number: u32,
    /// The JS `err.code` (`ERR_SHARDLIMIT_CONFIG`, ...).
    pub code: String,
}

/// Every error kind of the core (`ErrorKind::ALL`), in code order.
#[napi(catch_unwind)]
pub fn error_kinds() -> Vec<ErrorKindInfo> {
    shardlimit::ErrorKind::ALL
        .iter()
        .map(|k| ErrorKindInfo {
            name: k.name().to_string(),
            number: k.code(),
            code: code_of(k.name()),
        })
        .collect()
}

/// The version of the core this addon was built from.
#[napi(catch_unwind)]
pub fn core_version() -> String {
    shardlimit::VERSION.to_string()
}

/// A test-only panic, to check that panics become errors instead of crashing Node.
#[napi(catch_unwind)]
pub fn panic_for_test(env: Env, message: String) -> Result<()> {
    let r = guarded(|| -> shardlimit::Result<()> { panic!("{message}") });
    r.map_err(|e| core_error(&env, e))
}

/// A clock that moves only when told to, for deterministic tests and replays.
#[napi]
pub struct ManualClock {
    inner: Arc<shardlimit::ManualClock>,
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

/// A held lease of a concurrency policy: a plain object, safe to pass between workers.
#[napi(object)]
#[derive(Clone)]
pub struct Lease {
    pub key: String,
    pub policy: String,
    pub id: String,
    pub units: f64,
}

/// The native limiter; `index.js` wraps it with argument checks.
#[napi]
pub struct NativeLimiter {
    inner: shardlimit::Limiter,
}

fn with_clock(
    limiter: shardlimit::Limiter,
    clock: Option<&ManualClock>,
) -> shardlimit::Result<shardlimit::Limiter> {
    match clock {
        Some(c) => limiter.with_clock(c.inner.clone()),
        None => Ok(limiter),
    }
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

    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check(
        &self,
        env: Env,
        key: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let cost = units("cost", cost)?;
                me.check_by_name(&key, &policy, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.policy(&policy)?;
                me.peek(&key, &p).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; lease: Lease | null }>"
    )]
    pub fn acquire(
        &self,
        env: Env,
        key: String,
        policy: String,
        units_: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("units", units_),
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            calls::lease_obj,
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn release(&self, env: Env, lease: Lease) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let lease = shardlimit::Lease {
                    units: units("lease.units", lease.units)?,
                    key: lease.key,
                    policy: lease.policy,
                    id: lease.id,
                };
                me.release(&lease).await
            },
            |_, released| Ok(released),
        )
    }

    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn reset(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.policy(&policy)?;
                me.reset(&key, &p).await
            },
            |_, ()| Ok(()),
        )
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

    /// A layered check: allowed only if every layer allows; if any denies, none consumes.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_all(&self, env: Env, layers: Vec<LayerSpec>) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let layers = layers
                    .into_iter()
                    .enumerate()
                    .map(|(i, l)| {
                        let cost = units(&format!("layers[{i}].cost"), l.cost.unwrap_or(1.0))?;
                        Ok(shardlimit::Layer::new(l.key, &me.policy(&l.policy)?, cost))
                    })
                    .collect::<shardlimit::Result<Vec<_>>>()?;
                me.check_all(&layers).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Puts `key` on the block list for `ttlMs` milliseconds (null: until unblocked).
    #[napi(catch_unwind, ts_return_type = "Promise<void>")]
    pub fn block(
        &self,
        env: Env,
        key: String,
        ttl_ms: Option<f64>,
        reason: String,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let ttl = match ttl_ms {
                    Some(ms) => Some(Duration::from_micros(units("ttl", ms * 1000.0)?)),
                    None => None,
                };
                me.block(&key, ttl, &reason).await
            },
            |_, ()| Ok(()),
        )
    }

    /// Removes `key` from the block list; true when it was blocked.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn unblock(&self, env: Env, key: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.unblock(&key).await },
            |_, b| Ok(b),
        )
    }

    /// The block-list entry of `key`, or null.
    #[napi(catch_unwind, ts_return_type = "Promise<BlockInfo | null>")]
    pub fn blocked(&self, env: Env, key: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.blocked(&key).await },
            |_, info| {
                // a JSON value, so that a permanent block has `remaining: null`
                Ok(info.map(
                    |b| serde_json::json!({ "reason": b.reason, "remaining": b.remaining.map(ms) }),
                ))
            },
        )
    }

    /// Sets `key`'s live override of `policy` to `limit` (a rate string or a limit object
    /// in JSON text) for `ttlMs` milliseconds (null: until deleted).
    #[napi(catch_unwind, ts_return_type = "Promise<Override>")]
    pub fn set_override(
        &self,
        env: Env,
        key: String,
        policy: String,
        limit: String,
        ttl_ms: Option<f64>,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let ttl = match ttl_ms {
                    Some(ms) => Some(Duration::from_micros(units("ttl", ms * 1000.0)?)),
                    None => None,
                };
                me.set_override(&key, &policy, &limit, ttl).await
            },
            |_, info| Ok(override_js(&info)),
        )
    }

    /// `key`'s override of `policy`, or null.
    #[napi(catch_unwind, ts_return_type = "Promise<Override | null>")]
    pub fn get_override(&self, env: Env, key: String, policy: String) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.get_override(&key, &policy).await },
            |_, info| Ok(info.as_ref().map(override_js)),
        )
    }

    /// One page of `policy`'s overrides: `{ overrides, cursor }`.
    #[napi(catch_unwind, ts_return_type = "Promise<OverridePage>")]
    pub fn list_overrides(
        &self,
        env: Env,
        policy: String,
        cursor: Option<String>,
        limit: u32,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                me.list_overrides(&policy, cursor.as_deref(), limit as usize)
                    .await
            },
            |_, page| {
                Ok(serde_json::json!({
                    "overrides": page.overrides.iter().map(override_js).collect::<Vec<_>>(),
                    "cursor": page.cursor,
                }))
            },
        )
    }

    /// Deletes `key`'s override of `policy`; true when it had one.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn delete_override(
        &self,
        env: Env,
        key: String,
        policy: String,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move { me.delete_override(&key, &policy).await },
            |_, b| Ok(b),
        )
    }

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

    /// Counters per policy and the Redis latency histogram, in Prometheus text format.
    #[napi(catch_unwind)]
    pub fn metrics_prometheus(&self) -> String {
        self.inner.metrics().to_prometheus()
    }

    // ----- the rest of the core's surface (kept apart from the check path) -------------

    /// `$SHARDLIMIT_CONFIG` (a path, or inline JSON); the in-memory engine when unset.
    #[napi(factory, catch_unwind)]
    pub fn from_env(env: Env, clock: Option<&ManualClock>) -> Result<Self> {
        guarded(|| with_clock(shardlimit::Limiter::from_env()?, clock))
            .map(|inner| NativeLimiter { inner })
            .map_err(|e| core_error(&env, e))
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

    /// Calls `callback(event)` on this thread for every event of the core (denials,
    /// blocks, fallbacks, circuit changes). Events are queued (at most 1024; more are
    /// dropped while JS is busy) and never keep the process alive.
    #[napi(catch_unwind)]
    pub fn subscribe(
        &self,
        callback: Function<'_, serde_json::Value, Unknown<'static>>,
    ) -> Result<()> {
        let tsfn = callback
            .build_threadsafe_function::<serde_json::Value>()
            .weak::<true>()
            .max_queue_size::<1024>()
            .build_callback(|ctx| Ok(ctx.value))?;
        self.inner.subscribe(Arc::new(move |e: &shardlimit::Event| {
            tsfn.call(event_json(e), ThreadsafeFunctionCallMode::NonBlocking);
        }));
        Ok(())
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

    /// Checks the config's policy `policy` as plan `plan` has it.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_plan(
        &self,
        env: Env,
        key: String,
        plan: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let cost = units("cost", cost)?;
                let p = me.plan_policy(&plan, &policy)?;
                me.check(&key, &p, cost).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Peeks at the config's policy `policy` as plan `plan` has it.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek_plan(
        &self,
        env: Env,
        key: String,
        plan: String,
        policy: String,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let p = me.plan_policy(&plan, &policy)?;
                me.peek(&key, &p).await
            },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// The config's policy `policy` as plan `plan` has it (`PolicyInfo`).
    #[napi(catch_unwind, ts_return_type = "PolicyInfo")]
    pub fn plan_policy_info(
        &self,
        env: Env,
        plan: String,
        policy: String,
    ) -> Result<serde_json::Value> {
        guarded(|| self.inner.plan_policy(&plan, &policy))
            .map(|p| policy_json(&p))
            .map_err(|e| core_error(&env, e))
    }

    /// `check` in shadow mode for this one call (`{ shadow: true }`).
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_shadow(
        &self,
        env: Env,
        key: String,
        policy: String,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::named(policy),
            ("cost", cost),
            |l, k, p, n| async move { l.check_shadow(&k, &p, n).await },
            calls::decision,
        )
    }

    /// `checkLimit` in shadow mode for this one call.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_limit_shadow(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("cost", cost),
            |l, k, p, n| async move { l.check_shadow(&k, &p, n).await },
            calls::decision,
        )
    }

    /// The shadow-mode denials of a policy by key, summed over every shard:
    /// `{ policy, total, untracked, keys: [{ key, count }] }`; `top` (> 0) keeps that many.
    #[napi(catch_unwind, ts_return_type = "Promise<ShadowReport>")]
    pub fn shadow_report(
        &self,
        env: Env,
        policy: String,
        top: Option<f64>,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let top = match top {
                    Some(t) => Some(units("top", t)? as usize),
                    None => None,
                };
                me.shadow_report(&policy, top).await
            },
            |_, r| Ok(r.to_json()),
        )
    }

    /// Checks an ad-hoc limit (see `NativeLimit`).
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn check_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        cost: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("cost", cost),
            |l, k, p, n| async move { l.check(&k, &p, n).await },
            calls::decision,
        )
    }

    /// Peeks at an ad-hoc limit.
    #[napi(catch_unwind, ts_return_type = "Promise<Decision>")]
    pub fn peek_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        let p = limit.policy.clone();
        promise(
            &env,
            &self.inner,
            async move { me.peek(&key, &p).await },
            |_, d| Ok(Decision { inner: d }),
        )
    }

    /// Acquires a lease of an ad-hoc concurrency limit.
    #[napi(
        catch_unwind,
        ts_return_type = "Promise<{ decision: Decision; lease: Lease | null }>"
    )]
    pub fn acquire_limit(
        &self,
        env: Env,
        key: String,
        limit: &NativeLimit,
        units_: f64,
    ) -> Result<Unknown<'static>> {
        self.units_call(
            &env,
            key,
            calls::ad_hoc(limit),
            ("units", units_),
            |l, k, p, n| async move { l.acquire(&k, &p, n).await },
            calls::lease_obj,
        )
    }

    /// Releases a lease of an ad-hoc concurrency limit.
    #[napi(catch_unwind, ts_return_type = "Promise<boolean>")]
    pub fn release_limit(
        &self,
        env: Env,
        lease: Lease,
        limit: &NativeLimit,
    ) -> Result<Unknown<'static>> {
        let me = self.inner.clone();
        let p = limit.policy.clone();
        promise(
            &env,
            &self.inner,
            async move {
                let lease = shardlimit::Lease {
                    units: units("lease.units", lease.units)?,
                    key: lease.key,
                    policy: lease.policy,
                    id: lease.id,
                };
                me.release_with(&p, &lease).await
            },
            |_, released| Ok(released),
        )
    }
}

fn policy_json(p: &shardlimit::Policy) -> serde_json::Value {
    let mut v = limit_json(p.limit());
    v["name"] = p.name().into();
    v["max"] = p.max().into();
    v["onError"] = p.on_error().name().into();
    if p.is_multi() {
        // every limit of a multi-limit policy: `{ algorithm, params }`
        v["limits"] = p.limits().iter().map(limit_json).collect();
    }
    v
}

/// `{ algorithm, params }` of one limit.
fn limit_json(l: &shardlimit::Limit) -> serde_json::Value {
    use shardlimit::Limit;
    let params = match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            serde_json::json!({ "limit": limit, "windowMs": ms(*window) })
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => serde_json::json!({ "capacity": capacity, "refillPerSec": refill_per_sec }),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => serde_json::json!({ "capacity": capacity, "leakPerSec": leak_per_sec }),
        Limit::Concurrency { max, lease_ttl } => {
            serde_json::json!({ "max": max, "leaseTtlMs": ms(*lease_ttl) })
        }
    };
    serde_json::json!({
        "algorithm": l.algorithm().name(),
        "params": params,
    })
}

fn camel(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut up = false;
    for c in field.chars() {
        if c == '_' {
            up = true;
        } else if up {
            out.extend(c.to_uppercase());
            up = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// An event as a plain object: `kind` plus its fields (strings, as in the events stream),
/// in camelCase.
fn event_json(e: &shardlimit::Event) -> serde_json::Value {
    let mut obj = serde_json::Map::new();
    obj.insert("kind".into(), e.kind().into());
    for (k, v) in e.fields() {
        if k != "kind" {
            obj.insert(camel(k), v.into());
        }
    }
    serde_json::Value::Object(obj)
}

/// A config-file watcher from `watchConfig`; `close()` stops it.
#[napi]
pub struct NativeWatcher {
    inner: Option<shardlimit::ConfigWatcher>,
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

/// An ad-hoc limit, validated once: a policy object of the config format
/// (`{ algorithm, limit, window, ... }`) under a name of the caller's choosing (headers,
/// bodies, metrics and Redis keys show it), or the limit's parameters when unnamed.
#[napi]
pub struct NativeLimit {
    policy: shardlimit::Policy,
}

#[napi]
impl NativeLimit {
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, spec_json: String, name: Option<String>) -> Result<Self> {
        guarded(|| {
            let v = shardlimit::config::parse_strict_json(&spec_json)?;
            let slot = name.clone().unwrap_or_else(|| "adhoc".to_string());
            let prefix = format!("policies.{slot}");
            let cfg = shardlimit::Config::from_value(
                &serde_json::json!({ "policies": { slot.clone(): v } }),
            )
            .map_err(|e| match e {
                shardlimit::Error::Config { field, message } => shardlimit::Error::Config {
                    field: if name.is_some() && field == prefix {
                        "limit.name".into()
                    } else {
                        field.replacen(&prefix, "limit", 1)
                    },
                    message,
                },
                other => other,
            })?;
            let p = cfg
                .policies
                .get(&slot)
                .cloned()
                .ok_or_else(|| shardlimit::Error::Internal("ad-hoc policy lost".into()))?;
            match name {
                Some(_) => Ok(p),
                None => Ok(shardlimit::Policy::from_limits(p.limits())?
                    .with_on_error(p.on_error())
                    .with_window_offset(p.window_offset())?),
            }
        })
        .map(|policy| NativeLimit { policy })
        .map_err(|e| core_error(&env, e))
    }

    /// The policy name decisions carry.
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.policy.name().to_string()
    }

    /// The limit as an object (`PolicyInfo`).
    #[napi(catch_unwind, ts_return_type = "PolicyInfo")]
    pub fn info(&self) -> serde_json::Value {
        policy_json(&self.policy)
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

/// One layer of a layered check.
#[napi(object)]
pub struct LayerSpec {
    pub key: String,
    pub policy: String,
    pub cost: Option<f64>,
}

/// Trusted proxy networks, parsed once, for finding the client IP behind proxies.
#[napi]
pub struct TrustedProxies {
    inner: shardlimit::TrustedProxies,
}

#[napi]
impl TrustedProxies {
    /// `cidrs`: `10.0.0.0/8`, `2001:db8::/32`, or bare addresses.
    /// `ipv6_prefix` (1 to 128, default 64): how many bits of an IPv6 client's address
    /// make its key (`client_key`).
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, cidrs: Vec<String>, ipv6_prefix: Option<u32>) -> Result<Self> {
        guarded(|| {
            let t = shardlimit::TrustedProxies::parse(&cidrs)?;
            match ipv6_prefix {
                Some(p) => t.with_ipv6_prefix(ipv6_prefix_u8(p)?),
                None => Ok(t),
            }
        })
        .map(|inner| TrustedProxies { inner })
        .map_err(|e| core_error(&env, e))
    }

    /// The rate-limit key of the client (the core's `client_key`): its address, IPv6
    /// aggregated to the prefix given to the constructor (`2001:db8:1:2::/64`).
    #[napi(catch_unwind)]
    pub fn client_key(
        &self,
        env: Env,
        peer: String,
        x_forwarded_for: Option<String>,
    ) -> Result<String> {
        guarded(|| {
            let peer = shardlimit::parse_peer(&peer)?;
            Ok(self.inner.client_key(peer, x_forwarded_for.as_deref()))
        })
        .map_err(|e| core_error(&env, e))
    }

    /// The client address (the core's rule): the peer unless it is a trusted proxy; then
    /// `X-Forwarded-For` from the right up to the first untrusted hop.
    #[napi(catch_unwind)]
    pub fn client_ip(
        &self,
        env: Env,
        peer: String,
        x_forwarded_for: Option<String>,
    ) -> Result<String> {
        guarded(|| {
            let peer = shardlimit::parse_peer(&peer)?;
            Ok(
                shardlimit::client_ip_with(peer, x_forwarded_for.as_deref(), &self.inner)
                    .to_string(),
            )
        })
        .map_err(|e| core_error(&env, e))
    }
}

fn ipv6_prefix_u8(p: u32) -> shardlimit::Result<u8> {
    u8::try_from(p).map_err(|_| shardlimit::Error::InvalidArgument {
        what: "ipv6_prefix".into(),
        message: format!("must be between 1 and 128, got {p}"),
    })
}

/// The rate-limit key of a client address (the core's `ip_key`): IPv4 (also IPv4-mapped)
/// as itself, IPv6 as its network of `ipv6_prefix` bits (1 to 128, default 64).
#[napi(catch_unwind)]
pub fn ip_key(env: Env, ip: String, ipv6_prefix: Option<u32>) -> Result<String> {
    guarded(|| {
        let p = ipv6_prefix_u8(ipv6_prefix.unwrap_or(shardlimit::DEFAULT_IPV6_PREFIX as u32))?;
        shardlimit::client_ip_key(&ip, None, &[] as &[&str], p)
    })
    .map_err(|e| core_error(&env, e))
}

/// The client address behind proxies (see `TrustedProxies.clientIp`).
#[napi(catch_unwind)]
pub fn client_ip(
    env: Env,
    peer: String,
    x_forwarded_for: Option<String>,
    trusted_proxies: Vec<String>,
) -> Result<String> {
    guarded(|| shardlimit::client_ip(&peer, x_forwarded_for.as_deref(), &trusted_proxies))
        .map(|ip| ip.to_string())
        .map_err(|e| core_error(&env, e))
}

/// Where a key routes.
#[napi(object)]
pub struct ShardRoute {
    pub index: u32,
    pub name: String,
}

/// The addon's image stays mapped for the life of the process. Node unloads an addon when
/// the last environment that loaded it goes away (a worker that exits when the main thread
/// never loaded it), but the core's I/O runtime threads and the thread-local destructors of
/// the threads that called in outlive that environment and run the addon's code. Runs once,
/// when the image is loaded.
///
/// The addon uses the system allocator, not mimalloc: mimalloc takes the thread that
/// loads it for the process's main thread, whose heap is static and set up once. Loaded
/// from a worker, that thread exits and its heap is torn down; glibc gives the exited
/// thread's descriptor to the next thread it creates, which mimalloc then takes for the
/// main thread and hands the torn-down heap: the next worker to load the addon crashed
/// in its first allocation (issue 13.5, `test/worker-reload.test.js`).
#[napi_derive::module_init]
fn pin_the_addon_image() {
    napi::bindgen_prelude::retain_current_module_for_unload_safety();
}
