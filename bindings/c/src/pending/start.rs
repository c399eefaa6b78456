//! The `_start` twins of the blocking calls: each checks its arguments like its blocking
//! form (`args.rs`) and returns at once with a `shardlimit_pending`.

use super::*;

/// `shardlimit_check()` that returns at once: on success `*out_pending` is a new pending
/// the caller owns, and `callback` (may be NULL) will be called exactly once with `user`
/// when it completes (see `shardlimit_callback`); read the decision with
/// `shardlimit_pending_decision()`. The key is copied: nothing is retained. On failure no
/// pending is made and the callback is never called.
/// Thread-safe; may be called from a callback. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL (the call's own result comes through
/// the pending).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_check_start(
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
        |me, key, p, cost| async move { me.check(&key, &p, cost).await },
    )
}

/// `shardlimit_check_named()` that returns at once (see `shardlimit_check_start()`): the
/// policy named by `policy_len` bytes at `policy` (copied). An unknown policy fails here,
/// with UNKNOWN_POLICY, and no pending is made.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_check_named_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    cost: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, name) = named_args(Form::Start, limiter, key, key_len, policy, policy_len)?;
        let (me, key, p) = (l.clone(), owned_key(key), l.policy(name)?);
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Decision(me.check(&key, &p, cost).await?))
        })
    })
}

/// `shardlimit_peek()` that returns at once (see `shardlimit_check_start()`); read the
/// decision with `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_peek_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let (me, key) = (l.clone(), owned_key(key));
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Decision(me.peek(&key, &p).await?))
        })
    })
}

/// `shardlimit_check_all()` that returns at once (see `shardlimit_check_start()`): the
/// layers are read (and copied) during this call. Read the decision with
/// `shardlimit_pending_decision()`.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_check_all_start(
    limiter: *const shardlimit_limiter,
    layers: *const shardlimit_layer,
    count: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let built = layers_arg(&l, layers, count)?;
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Decision(me.check_all(&built).await?))
        })
    })
}

/// `shardlimit_acquire()` that returns at once (see `shardlimit_check_start()`); read the
/// decision and the lease with `shardlimit_pending_acquired()`. A lease that is never
/// read is freed with the pending (its units expire after the lease TTL).
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_acquire_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    units: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let (me, key) = (l.clone(), owned_key(key));
        start(l, callback, user, out_pending, async move {
            let (d, lease) = me.acquire(&key, &p, units).await?;
            Ok(Outcome::Acquired(
                d,
                lease.map(|lease| shardlimit_lease { lease, policy: p }),
            ))
        })
    })
}

/// `shardlimit_release()` that returns at once (see `shardlimit_check_start()`); read
/// whether the lease was still held with `shardlimit_pending_bool()`. The lease object
/// stays the caller's.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_release_start(
    limiter: *const shardlimit_limiter,
    lease: *const shardlimit_lease,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let held = live("lease", lease)?;
        let (lease, policy) = (held.lease.clone(), held.policy.clone());
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Bool(me.release_with(&policy, &lease).await?))
        })
    })
}

/// `shardlimit_connect()` that returns at once (see `shardlimit_check_start()`); its result
/// is `shardlimit_pending_result()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_connect_start(
    limiter: *const shardlimit_limiter,
    timeout_ms: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            me.connect(std::time::Duration::from_millis(timeout_ms))
                .await?;
            Ok(Outcome::Unit)
        })
    })
}

/// `shardlimit_reset()` that returns at once (see `shardlimit_check_start()`); its result
/// is `shardlimit_pending_result()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_reset_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, p) = keyed_args(Form::Start, limiter, key, key_len, policy)?;
        let (me, key) = (l.clone(), owned_key(key));
        start(l, callback, user, out_pending, async move {
            me.reset(&key, &p).await?;
            Ok(Outcome::Unit)
        })
    })
}

/// `shardlimit_block()` that returns at once (see `shardlimit_check_start()`); its result
/// is `shardlimit_pending_result()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_block_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    ttl_ms: u64,
    reason: *const c_char,
    reason_len: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let key = owned_key(key_arg(key, key_len)?);
        if reason_len > 1024 {
            return Err(invalid("reason", "at most 1024 bytes"));
        }
        let reason = str_arg("reason", reason, reason_len)?.to_string();
        let ttl = (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms));
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            me.block(&key, ttl, &reason).await?;
            Ok(Outcome::Unit)
        })
    })
}

/// `shardlimit_unblock()` that returns at once (see `shardlimit_check_start()`); read
/// whether the key was blocked with `shardlimit_pending_bool()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_unblock_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    start_key(
        limiter,
        key,
        key_len,
        (callback, user, out_pending),
        err,
        |me, key| async move { Ok(Outcome::Bool(me.unblock(&key).await?)) },
    )
}

/// `shardlimit_blocked()` that returns at once (see `shardlimit_check_start()`); read the
/// entry with `shardlimit_pending_block_info()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_blocked_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    start_key(
        limiter,
        key,
        key_len,
        (callback, user, out_pending),
        err,
        |me, key| async move { Ok(Outcome::Blocked(me.blocked(&key).await?)) },
    )
}
