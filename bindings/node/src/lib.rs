//! The Node.js binding of shardlimit: a thin napi-rs skin over the core.
//!
//! This crate only converts types and errors, one module per area of the core's `limiter/`
//! (check, lease, settle, shadow, block, overrides, admin, events...). Argument *type*
//! checks (TypeError) are done by the JavaScript wrapper in `index.js`; values are validated
//! by the core.
//!
//! Async calls: on the Redis engine, each call is spawned on the core's own Tokio runtime
//! (`Limiter::spawner`, which starts the calls of a burst together so their commands leave
//! in one write); its Promise is settled from there through the environment's
//! batched settle queue (`promises.rs`: one threadsafe function per environment, one event-loop
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

mod admin;
mod block;
mod calls;
mod check;
pub mod decision;
mod errors;
mod events;
mod host;
mod ip;
mod lease;
mod limiter;
mod logging;
mod overrides;
mod policy;
mod promises;
mod settle;
mod shadow;

pub use admin::*;
pub use check::*;
use decision::Decision;
pub use errors::*;
pub use ip::*;
pub use lease::*;
pub use limiter::*;
pub use policy::*;

/// The JS function `(kindName, message) => Error` that `index.js` registers in each
/// environment (main thread and every worker).
type ErrorFactory = FunctionRef<FnArgs<(String, String)>, Unknown<'static>>;

/// What the addon keeps per environment (napi instance data).
struct EnvData {
    factory: Option<ErrorFactory>,
    settler: Option<promises::Settler>,
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
            settler: Some(promises::Settler::new(env)?),
            decision_class: None,
        };
        env.set_instance_data(data, (), |_| {})?;
    }
    env_data(env).ok_or_else(|| Error::from_reason("shardlimit: no instance data"))
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
                    unsafe { promises::settle(raw_env, deferred, value) }
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
/// in its first allocation (`test/worker-reload.test.js`).
#[napi_derive::module_init]
fn pin_the_addon_image() {
    napi::bindgen_prelude::retain_current_module_for_unload_safety();
}
