//! Creating and freeing a limiter (`shardlimit_limiter`), and connecting it ahead of use.

use super::*;

/// A rate limiter: a configuration, an engine (Redis shards or in-memory), and for Redis
/// its own I/O runtime and one connection per shard, created on first use and re-created
/// in a forked child. Thread-safe: one handle may be used from any number of threads at
/// once, and freed while they do (see `shardlimit_limiter_free()`). An opaque handle:
/// never dereference it. Create with a `shardlimit_limiter_new_*` function; the caller owns
/// it and frees it with `shardlimit_limiter_free()`.
pub struct shardlimit_limiter {
    pub(crate) limiter: Limiter,
    /// The subscriptions' fan-out (`events.rs`), made on the first `shardlimit_subscribe()`.
    pub(crate) fanout: events::FanoutCell,
    /// The log callback and log subscriptions (`logging.rs`), made on first use.
    pub(crate) logs: logging::LogFanoutCell,
}

// ---------------------------------------------------------------------------------------
// Limiter

pub(crate) fn new_limiter(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    make: impl FnOnce() -> Result<Limiter, CoreError>,
) -> Result<(), Error> {
    let out = out_arg("out", out)?;
    let clock = clock_arg(clock)?;
    let mut limiter = make()?;
    if let Some(c) = clock {
        limiter = limiter.with_clock(c)?;
    }
    let l = shardlimit_limiter {
        limiter,
        fanout: Default::default(),
        logs: Default::default(),
    };
    logging::default_to_stderr(&l);
    out.write(register(l)?);
    Ok(())
}

/// Creates a limiter from a JSON configuration (the format of `shard-config.json`):
/// `json_len` bytes of UTF-8 at `json` (the caller keeps ownership; it is not retained).
/// With `shards` the limiter decides on Redis, otherwise in memory. Does not connect:
/// connections are made on first use.
///
/// `clock` may be NULL (the normal case); otherwise decisions read time from it (tests).
/// On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL; on failure `*err` receives an error
/// to free with `shardlimit_error_free()`.
/// Results: OK, CONFIG (the message names the field), INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_json(
    json: *const c_char,
    json_len: usize,
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let text = bytes_arg("json", json, json_len)?;
        let text = std::str::from_utf8(text).map_err(|e| CoreError::Config {
            field: "config".to_string(),
            message: format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
        })?;
        new_limiter(clock, out, || Limiter::from_json(text))
    })
}

/// Creates a limiter from a JSON configuration file at the path given by `path_len`
/// bytes at `path` (not NUL-terminated; not retained).
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, IO (cannot read the file), CONFIG, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_file(
    path: *const c_char,
    path_len: usize,
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let bytes = bytes_arg("path", path, path_len)?;
        if bytes.is_empty() {
            return Err(invalid("path", "is empty"));
        }
        if bytes.contains(&0) {
            return Err(invalid("path", "contains a NUL byte: is the length right?"));
        }
        #[cfg(unix)]
        let p = {
            use std::os::unix::ffi::OsStrExt;
            std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
        };
        #[cfg(not(unix))]
        let p = std::path::PathBuf::from(str_arg("path", path, path_len)?);
        new_limiter(clock, out, || Limiter::from_config_file(&p))
    })
}

/// Creates a limiter on the in-memory engine with no named policies (use
/// `shardlimit_policy_new()` for its policies). Decisions are local to this process.
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_memory(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || new_limiter(clock, out, || Ok(Limiter::memory())))
}

/// Creates a limiter from `$SHARDLIMIT_CONFIG` (a file path, or inline JSON starting
/// with `{`); the in-memory engine with no policies when it is unset or empty.
///
/// `clock` may be NULL. On success `*out` is a new limiter the caller owns (free with
/// `shardlimit_limiter_free()`). `err` may be NULL.
/// Results: OK, CONFIG, IO, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_new_env(
    clock: *const shardlimit_clock,
    out: *mut *mut shardlimit_limiter,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || new_limiter(clock, out, Limiter::from_env))
}

/// Closes and frees a limiter. Safe while other threads use it: calls already in flight
/// finish normally with this limiter (their decisions are this limiter's), every later
/// call with the handle returns `SHARDLIMIT_ERR_CLOSED`; the runtime and connections are
/// shut down when the last call in flight returns. The handle is never given to another
/// limiter, so a limiter created right after (a config reload) can never answer for it.
/// Policies and leases obtained from it stay valid objects and must be freed separately.
/// NULL, a limiter already freed, or a pointer that is not a limiter, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_free(limiter: *mut shardlimit_limiter) {
    quiet((), || drop(unregister(limiter)))
}

/// Connects to every shard and loads the scripts within `timeout_ms` (its own budget, not
/// a call's deadline), so that the first calls after start-up do not spend their deadline
/// on a TCP connect. Blocks for at most `timeout_ms`. Nothing to do in memory. Thread-safe.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a zero timeout), CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE,
/// CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_connect(
    limiter: *const shardlimit_limiter,
    timeout_ms: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        Ok(l.connect_blocking(std::time::Duration::from_millis(timeout_ms))?)
    })
}
