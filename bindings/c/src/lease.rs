//! Leases of a concurrency policy (`shardlimit_acquire`, `shardlimit_release`).

use super::*;

/// A held lease of a concurrency policy, from `shardlimit_acquire()`. Give it back with
/// `shardlimit_release()` (or let it expire after the policy's lease TTL), then free the
/// object with `shardlimit_lease_free()`. Freeing does not release the lease. An opaque
/// handle owned by the caller; thread-safe (releasing it twice is harmless).
pub struct shardlimit_lease {
    pub(crate) lease: Lease,
    pub(crate) policy: Policy,
}

/// Acquires `units` (≥ 1) of a concurrency policy for `key`.
///
/// On success `*out` is filled and `*out_lease` is set: to a new lease the caller owns
/// when Redis granted the units (give it back with `shardlimit_release()`, then free it
/// with `shardlimit_lease_free()`), or to NULL when nothing is held: when denied, and also
/// when a fallback allowed the call (`out->allowed` with `out->source ==
/// SHARDLIMIT_SOURCE_FALLBACK`: Redis could not be asked, `on_error` "open" or "local").
/// So branch on `out->allowed`, not on the lease: a NULL lease with `out->allowed` is an
/// admission with nothing to release. Blocks for at most the configured deadline.
/// Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_acquire(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    units: u64,
    out: *mut shardlimit_decision,
    out_lease: *mut *mut shardlimit_lease,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let out_lease = out_arg("out_lease", out_lease)?;
        let (d, lease) = l.acquire_blocking(key, &p, units)?;
        let d = decision_to_c(&d)?;
        let lease = match lease {
            Some(lease) => register(shardlimit_lease { lease, policy: p })?,
            None => std::ptr::null_mut(),
        };
        out.write(d);
        out_lease.write(lease);
        Ok(())
    })
}

/// Gives back a lease from `shardlimit_acquire()`. On success `*out_released` is true when
/// the lease was still held, false when it had already been released or had expired. The
/// lease object stays owned by the caller (free it with `shardlimit_lease_free()`).
/// `out_released` may be NULL. Blocks for at most the configured deadline. Thread-safe.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_release(
    limiter: *const shardlimit_limiter,
    lease: *const shardlimit_lease,
    out_released: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let held = live("lease", lease)?;
        let (lease, policy) = (held.lease.clone(), held.policy.clone());
        let out_released = opt_out_arg("out_released", out_released)?;
        let me = l.clone();
        let released = l.block_on(async move { me.release_with(&policy, &lease).await })?;
        if let Some(out_released) = out_released {
            out_released.write(released);
        }
        Ok(())
    })
}

/// Frees a lease object without releasing the lease (it expires after the policy's lease
/// TTL unless `shardlimit_release()` was called). NULL, or a lease already freed, is a
/// no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_lease_free(lease: *mut shardlimit_lease) {
    quiet((), || drop(unregister(lease)))
}
