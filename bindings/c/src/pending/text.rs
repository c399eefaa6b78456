//! The `_start` forms of the calls that answer with JSON text (live overrides, the shadow
//! report): the same arguments and answers as their blocking forms in `overrides.rs` and
//! `shadow.rs`, completing later like every started call, so that a host waiting on them
//! (Go's `select` with `ctx.Done()`) holds no thread for the round trip and can cancel it.
//! Their answer is read with `shardlimit_pending_string()` (or `_bool` for the delete).

use super::*;
use crate::overrides::{cursor_arg, limit_arg};

/// `shardlimit_set_override()` that returns at once (see `shardlimit_check_start()`): the
/// key, policy name and limit are copied (nothing is retained). Read the override as JSON
/// with `shardlimit_pending_string()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL (the call's own result, UNKNOWN_POLICY
/// or a bad limit included, comes through the pending).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_set_override_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    limit: *const c_char,
    limit_len: usize,
    ttl_ms: u64,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) = named_args(Form::Start, limiter, key, key_len, policy, policy_len)?;
        let limit = limit_arg(limit, limit_len)?.to_string();
        let ttl = (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms));
        let (me, key, policy) = (l.clone(), owned_key(key), policy.to_string());
        start(l, callback, user, out_pending, async move {
            let info = me.set_override(&key, &policy, &limit, ttl).await?;
            Ok(Outcome::Text(Some(info.to_json().to_string())))
        })
    })
}

/// `shardlimit_get_override()` that returns at once (see `shardlimit_check_start()`).
/// Read it with `shardlimit_pending_string()`: found false when the key has no override.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_get_override_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) = named_args(Form::Start, limiter, key, key_len, policy, policy_len)?;
        let (me, key, policy) = (l.clone(), owned_key(key), policy.to_string());
        start(l, callback, user, out_pending, async move {
            let info = me.get_override(&key, &policy).await?;
            Ok(Outcome::Text(info.map(|i| i.to_json().to_string())))
        })
    })
}

/// `shardlimit_delete_override()` that returns at once (see `shardlimit_check_start()`);
/// read whether the key had an override with `shardlimit_pending_bool()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_delete_override_start(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) = named_args(Form::Start, limiter, key, key_len, policy, policy_len)?;
        let (me, key, policy) = (l.clone(), owned_key(key), policy.to_string());
        start(l, callback, user, out_pending, async move {
            Ok(Outcome::Bool(me.delete_override(&key, &policy).await?))
        })
    })
}

/// `shardlimit_list_overrides()` that returns at once (see `shardlimit_check_start()`);
/// the cursor is copied. Read the page as JSON with `shardlimit_pending_string()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_list_overrides_start(
    limiter: *const shardlimit_limiter,
    policy: *const c_char,
    policy_len: usize,
    cursor: *const c_char,
    cursor_len: usize,
    limit: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let policy = policy_name_arg(policy, policy_len)?.to_string();
        let cursor = cursor_arg(cursor, cursor_len)?.map(str::to_string);
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            let page = me.list_overrides(&policy, cursor.as_deref(), limit).await?;
            Ok(Outcome::Text(Some(page.to_json().to_string())))
        })
    })
}

/// `shardlimit_shadow_report()` that returns at once (see `shardlimit_check_start()`);
/// read the report as JSON with `shardlimit_pending_string()`.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_shadow_report_start(
    limiter: *const shardlimit_limiter,
    policy: *const c_char,
    policy_len: usize,
    top: usize,
    callback: shardlimit_callback,
    user: *mut c_void,
    out_pending: *mut *mut shardlimit_pending,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = start_limiter(limiter)?;
        let policy = policy_name_arg(policy, policy_len)?.to_string();
        let me = l.clone();
        start(l, callback, user, out_pending, async move {
            let r = me.shadow_report(&policy, (top > 0).then_some(top)).await?;
            Ok(Outcome::Text(Some(r.to_json().to_string())))
        })
    })
}

/// The JSON answer of a completed `shardlimit_set_override_start()`,
/// `_get_override_start()`, `_list_overrides_start()` or `_shadow_report_start()`: on
/// success `*out_found` (may be NULL) says whether there is one (false only for a key
/// without an override) and `*out` is a new owned string the caller frees with
/// `shardlimit_string_free()` (an empty struct, NULL `ptr`, when not found). May be read
/// more than once (each read is a new string). The call's own error otherwise;
/// INVALID_ARGUMENT when it has not completed or is another kind of call. Thread-safe.
/// `err` may be NULL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_pending_string(
    pending: *const shardlimit_pending,
    out_found: *mut bool,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out = out_arg("out", out)?;
        let out_found = opt_out_arg("out_found", out_found)?;
        let text = with_outcome(pending, |o| match o {
            Outcome::Text(t) => Ok(t.clone()),
            o => Err(wrong_kind(o, "text")),
        })?;
        if let Some(out_found) = out_found {
            out_found.write(text.is_some());
        }
        out.write(match text {
            Some(t) => owned_string(t),
            None => shardlimit_string {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        });
        Ok(())
    })
}
