//! The manual clock of deterministic tests (`shardlimit_clock`).

use super::*;

/// A manual clock for deterministic tests: limiters created with it read time from it
/// instead of Redis `TIME` or the monotonic clock. Thread-safe. Free with
/// `shardlimit_clock_free()` (limiters using it keep their own reference). An opaque
/// handle owned by the caller.
pub struct shardlimit_clock {
    pub(crate) clock: Arc<ManualClock>,
}

// ---------------------------------------------------------------------------------------
// Clock

/// Creates a manual clock reading `start_us` microseconds (Unix time is a good start).
///
/// On success `*out` is a new clock the caller owns (free with `shardlimit_clock_free()`).
/// `err` may be NULL; otherwise on failure `*err` receives an error to free with
/// `shardlimit_error_free()`. Results: OK, INVALID_ARGUMENT (`out` is NULL), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_new(
    start_us: u64,
    out: *mut *mut shardlimit_clock,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let c = register(shardlimit_clock {
            clock: ManualClock::new(start_us),
        })?;
        out.write(c);
        Ok(())
    })
}

/// Sets the clock to `now_us` microseconds. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`clock` NULL or not live), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_set_us(
    clock: *const shardlimit_clock,
    now_us: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let c = clock_arg(clock)?.ok_or_else(|| invalid("clock", "is NULL"))?;
        c.set_us(now_us);
        Ok(())
    })
}

/// Moves the clock forward by `delta_us` microseconds. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (`clock` NULL or not live), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_advance_us(
    clock: *const shardlimit_clock,
    delta_us: u64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let c = clock_arg(clock)?.ok_or_else(|| invalid("clock", "is NULL"))?;
        c.advance_us(delta_us);
        Ok(())
    })
}

/// Frees a clock. Limiters created with it keep working with it. NULL, or a clock
/// already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_clock_free(clock: *mut shardlimit_clock) {
    quiet((), || drop(unregister(clock)))
}
