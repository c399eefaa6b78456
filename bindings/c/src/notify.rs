//! Waking a host's own scheduler instead of a thread waiting in the library: a
//! subscription (events or warning lines) calls a `shardlimit_notify_callback` when it
//! goes from empty to holding something, and when it closes, so that a host drains it
//! with `_next(…, timeout_us = 0, …)` from its event loop (Go: a goroutine parked on a
//! channel, woken through the completion queue of started calls) and no OS thread waits
//! per subscription. Also `shardlimit_config_generation`, the cheap per-request test a
//! host's middleware makes before re-deriving something from the config.

use super::*;
use std::ffi::c_void;
use std::sync::OnceLock;

/// Called by a subscription with the `user` pointer given to its `_set_notify` function:
/// once when its queue goes from empty to holding an entry, and once when it closes (the
/// limiter is gone, or it is freed: then inside `_free`). Not once per entry: drain with
/// `_next` and a timeout of 0 until it says none came, then wait for the next call.
/// It runs on the thread that queued the entry (a caller's thread or the I/O thread) with
/// the subscription's lock held, so it must return quickly and must not call any function
/// of that subscription; signalling the host's scheduler (a pipe, an eventfd, a condition
/// variable) is what it is for. Once `_free` has returned it is never called again.
pub type shardlimit_notify_callback = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// The callback a subscription calls, set once.
#[derive(Default)]
pub(crate) struct Notify(OnceLock<(unsafe extern "C" fn(*mut c_void), usize)>);

impl Notify {
    /// Sets the callback; false when one was set before.
    pub(crate) fn set(&self, f: unsafe extern "C" fn(*mut c_void), user: *mut c_void) -> bool {
        self.0.set((f, user as usize)).is_ok()
    }

    /// Calls the callback, if one is set. The caller holds the queue's lock.
    #[inline]
    pub(crate) fn fire(&self) {
        if let Some(&(f, user)) = self.0.get() {
            // SAFETY: the caller's function with the pointer it registered; the header
            // says both must be usable from any thread until the subscription is freed
            unsafe { f(std::ptr::with_exposed_provenance_mut(user)) }
        }
    }
}

/// The callback argument of a `_set_notify` function, or what is wrong with it.
pub(crate) fn notify_arg(
    callback: shardlimit_notify_callback,
) -> Result<unsafe extern "C" fn(*mut c_void), Error> {
    callback.ok_or_else(|| invalid("callback", "is NULL; a function is required"))
}

/// The error of a second `_set_notify` on one subscription.
pub(crate) fn notify_set_twice() -> Error {
    invalid(
        "callback",
        "a notify callback is set already: each subscription takes one, once",
    )
}

/// How many reloads this limiter has applied: 0 when it was made, one more for each
/// `shardlimit_reload()`, `_reload_from_file()` or watched-file reload, counted once the
/// new configuration is in force. One atomic load: a middleware that derives something
/// from the configuration (which policies are concurrency limits) reads it per request
/// and derives again when it changed; read it before reading the configuration. On
/// success `*out` is the count. `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_config_generation(
    limiter: *const shardlimit_limiter,
    out: *mut u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = live("limiter", limiter)?;
        let out = out_arg("out", out)?;
        out.write(l.limiter.config_generation());
        Ok(())
    })
}
