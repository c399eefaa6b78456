//! Shadow mode in the C ABI: the per-call option (`shardlimit_check_shadow`, blocking, and
//! `shardlimit_check_shadow_start`, completing later) and the shadow counts
//! (`shardlimit_shadow_report`). Conversions only: the logic is the core's.

use super::*;

/// `shardlimit_check()` in shadow mode for this one call, whatever the policy says: a
/// check the limit would deny returns OK with `out->allowed == true` and
/// `out->shadow_denied == true`, consumes nothing, and is counted by key for
/// `shardlimit_shadow_report()`. Block-list denials and `on_error` fallbacks are not
/// shadowed. A concurrency policy is INVALID_ARGUMENT (a lease in shadow would hold
/// nothing).
///
/// Blocks the calling thread for at most the configured deadline (`timeout_ms`).
/// Thread-safe. On success `*out` (caller-allocated) is filled; nothing is allocated.
/// `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_shadow(
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
        Limiter::check_shadow_blocking,
    )
}

/// `shardlimit_check_shadow()` that returns at once (see `shardlimit_check_start()`);
/// read the decision with `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL (the call's own result comes through
/// the pending).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_check_shadow_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    cost: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    start_decision(
        limiter,
        key,
        key_len,
        policy,
        cost,
        (callback, user, out_pending),
        err,
        |me, key, p, cost| async move { me.check_shadow(&key, &p, cost).await },
    )
}

/// The shadow-mode denials of the policy named by `policy_len` bytes at `policy`, by key,
/// summed over every shard (on the in-memory engine: this process's counts), as JSON:
/// `{"policy":..,"total":..,"untracked":..,"keys":[{"key":..,"count":..}]}`, most first;
/// `top` keeps that many keys (0: every key; `total` always counts them all). On success
/// `*out` is an owned string the caller frees with `shardlimit_string_free()`.
///
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a policy name that cannot exist; a Redis Cluster),
/// CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_shadow_report(
    limiter: *const shardlimit_limiter,
    policy: *const c_char,
    policy_len: usize,
    top: usize,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let policy = policy_name_arg(policy, policy_len)?;
        let out = out_arg("out", out)?;
        let r = l.shadow_report_blocking(policy, (top > 0).then_some(top))?;
        out.write(owned_string(r.to_json().to_string()));
        Ok(())
    })
}
