//! Blocking checks: one key (`shardlimit_check`, `_check_named`, `_peek`, `_reset`) and
//! layered (`shardlimit_check_all`).

use super::*;

// ---------------------------------------------------------------------------------------
// Checks

/// The body of every blocking call of the shape (limiter, key, policy, cost) -> decision
/// (`shardlimit_check`, `_check_shadow`, `_charge`, `_refund`): the arguments checked, the
/// call made on the calling thread, the decision written to `*out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_blocking(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
    call: fn(&Limiter, &str, &Policy, u64) -> shardlimit::Result<Decision>,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&call(&l, key, &p, cost)?)?;
        out.write(d);
        Ok(())
    })
}

/// Checks `cost` units (≥ 1) of `policy` for the key given by `key_len` bytes of UTF-8 at
/// `key` (1 to 1024 bytes, no NUL; not retained). A denied check consumes nothing and is
/// not an error: it returns OK with `out->allowed == false`. A cost larger than the limit
/// is denied with `has_retry_after == false`. A concurrency policy is INVALID_ARGUMENT:
/// a check takes no lease, so nothing could give its units back; use
/// `shardlimit_acquire()`, which returns the lease to release (`shardlimit_peek()` reads
/// a concurrency policy's free units).
///
/// Blocks the calling thread for at most the configured deadline (`timeout_ms`).
/// Thread-safe. On success `*out` (caller-allocated) is filled; nothing is allocated.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    decide_blocking(
        limiter,
        key,
        key_len,
        policy,
        cost,
        out,
        err,
        Limiter::check_blocking,
    )
}

/// `shardlimit_check()` with the policy named by `policy_len` bytes at `policy` in the
/// limiter's configuration.
///
/// Blocks the calling thread for at most the configured deadline. Thread-safe. On success
/// `*out` (caller-allocated) is filled; nothing is allocated. `err` may be NULL.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE,
/// INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_named(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    cost: u64,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) =
            named_args(Form::Blocking, limiter, key, key_len, policy, policy_len)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.check_by_name_blocking(key, policy, cost)?)?;
        out.write(d);
        Ok(())
    })
}

/// The state of `key` under `policy` without consuming anything: `out->allowed` says
/// whether a check of one unit would pass now, `out->remaining` how many units are free.
///
/// Blocks for at most the configured deadline. Thread-safe. On success `*out` is filled.
/// `err` may be NULL. Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_peek(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.peek_blocking(key, &p)?)?;
        out.write(d);
        Ok(())
    })
}

/// Forgets `key`'s state under `policy`: its full budget is back.
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_reset(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Blocking, limiter, key, key_len, policy)?;
        Ok(l.reset_blocking(key, &p)?)
    })
}

/// One layer of `shardlimit_check_all()`: `cost` units of a policy for a key. The policy
/// is `policy` when it is not NULL, otherwise the configured policy named by
/// `policy_name_len` bytes at `policy_name`. Everything is borrowed for the call only.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_layer {
    /// The key: `key_len` bytes of UTF-8.
    pub key: *const c_char,
    /// The length of `key` in bytes.
    pub key_len: usize,
    /// A policy object, or NULL to use `policy_name`.
    pub policy: *const shardlimit_policy,
    /// A configured policy's name (used when `policy` is NULL).
    pub policy_name: *const c_char,
    /// The length of `policy_name` in bytes.
    pub policy_name_len: usize,
    /// Units to take (>= 1).
    pub cost: u64,
}

/// The most layers read from the caller's array; the core's own limit (64) is the one
/// that applies, this only bounds what a wrong `count` can make the library read.
pub(crate) const MAX_LAYERS_READ: usize = 1024;

/// The layers of a layered check, read from the caller's array (borrowed for the call).
pub(crate) fn layers_arg(
    l: &Limiter,
    layers: *const shardlimit_layer,
    count: usize,
) -> Result<Vec<Layer>, Error> {
    if count > MAX_LAYERS_READ {
        return Err(invalid(
            "count",
            format!("{count} layers; at most 64 are allowed"),
        ));
    }
    let raw = slice_arg("layers", layers, count)?;
    let mut built = Vec::with_capacity(raw.len());
    for (i, x) in raw.iter().enumerate() {
        let key = key_arg(x.key, x.key_len)
            .map_err(|e| invalid(&format!("layers[{i}].key"), e.to_string()))?;
        let policy = if x.policy.is_null() {
            l.policy(policy_name_arg(x.policy_name, x.policy_name_len)?)?
        } else {
            policy_arg(x.policy)?
        };
        built.push(Layer::new(key, &policy, x.cost));
    }
    Ok(built)
}

/// A layered check: `count` layers (IP, API key, tenant, global...) checked at once.
/// Allowed only if every layer allows; when any layer denies, no layer consumes. The
/// decision describes the layer that denied (the longest retry) or, when all allowed, the
/// one with the fewest units left; `out->layer` is its index. At most 64 layers.
///
/// `layers` (and everything it points to) is borrowed for the call only. Blocks for at
/// most the configured deadline. Thread-safe. On success `*out` is filled; nothing is
/// allocated. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_all(
    limiter: *const shardlimit_limiter,
    layers: *const shardlimit_layer,
    count: usize,
    out: *mut shardlimit_decision,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let built = layers_arg(&l, layers, count)?;
        let out = out_arg("out", out)?;
        let d = decision_to_c(&l.check_all_blocking(&built)?)?;
        out.write(d);
        Ok(())
    })
}
