//! The (limiter, key, policy) arguments most calls take, checked once for both forms of a
//! call: the blocking one and its `_start` twin (`pending.rs`), so that the two cannot
//! check them differently (order, bounds, messages).

use super::*;

pub(crate) fn str_arg<'a>(what: &str, ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    let bytes = bytes_arg(what, ptr, len)?;
    let s = std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            what,
            format!("is not valid UTF-8 (at byte {})", e.valid_up_to()),
        )
    })?;
    if let Some(i) = s.find('\0') {
        return Err(invalid(
            what,
            format!("contains a NUL byte at offset {i} of {len}: is the length right?"),
        ));
    }
    Ok(s)
}

/// A key: at most `MAX_KEY_LEN` bytes are ever read, so a wild length is an error rather
/// than a read past the caller's buffer.
pub(crate) fn key_arg<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    if len > MAX_KEY_LEN {
        return Err(invalid(
            "key",
            format!("is {len} bytes long; the maximum is {MAX_KEY_LEN}"),
        ));
    }
    str_arg("key", ptr, len)
}

/// Policy names are at most 128 bytes (the core validates the rest).
pub(crate) fn policy_name_arg<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    if len >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(CoreError::UnknownPolicy(format!(
            "<{len} bytes: longer than any policy name>"
        ))
        .into());
    }
    str_arg("policy", ptr, len)
}

pub(crate) fn limiter_arg(p: *const shardlimit_limiter) -> Result<Limiter, Error> {
    Ok(live("limiter", p)?.limiter.clone())
}

/// The limiter of a call that blocks its thread: refused inside a completion callback,
/// which runs on the limiter's I/O thread, where waiting for Redis would wait for itself.
pub(crate) fn blocking_limiter_arg(p: *const shardlimit_limiter) -> Result<Limiter, Error> {
    if pending::in_callback() {
        return Err(invalid(
            "limiter",
            "a blocking call from a completion callback (it runs on the library's I/O \
             thread, which would wait for itself): start the call with its _start \
             function instead",
        ));
    }
    limiter_arg(p)
}

pub(crate) fn policy_arg(p: *const shardlimit_policy) -> Result<Policy, Error> {
    Ok(live("policy", p)?.policy.clone())
}

/// An optional clock: NULL is none.
pub(crate) fn clock_arg(p: *const shardlimit_clock) -> Result<Option<Arc<ManualClock>>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    Ok(Some(live("clock", p)?.clock.clone()))
}

/// Which form of a call the arguments are for.
#[derive(Clone, Copy)]
pub(crate) enum Form {
    /// Runs on the caller's thread: refused inside a completion callback
    /// (`blocking_limiter_arg`).
    Blocking,
    /// A `_start` function: allowed inside a callback (`pending::start_limiter`). It copies
    /// the key before the call outlives its arguments.
    Start,
}

impl Form {
    fn limiter(self, p: *const shardlimit_limiter) -> Result<Limiter, Error> {
        match self {
            Form::Blocking => blocking_limiter_arg(p),
            Form::Start => pending::start_limiter(p),
        }
    }
}

/// The limiter, the key and a policy handle, in that order.
pub(crate) fn keyed_args<'a>(
    form: Form,
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const shardlimit_policy,
) -> Result<(Limiter, &'a str, Policy), Error> {
    let l = form.limiter(limiter)?;
    let key = key_arg(key, key_len)?;
    Ok((l, key, policy_arg(policy)?))
}

/// The limiter, the key and a policy name (bounded here; the core resolves it), in that
/// order.
pub(crate) fn named_args<'a>(
    form: Form,
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
) -> Result<(Limiter, &'a str, &'a str), Error> {
    let l = form.limiter(limiter)?;
    let key = key_arg(key, key_len)?;
    Ok((l, key, policy_name_arg(policy, policy_len)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;
    use std::ptr::{null, null_mut};

    /// A call's result code and, when it failed, its error's message.
    fn outcome(
        call: impl FnOnce(*mut *mut shardlimit_error) -> shardlimit_result,
    ) -> (shardlimit_result, String) {
        let mut e = null_mut();
        let code = call(&mut e);
        // SAFETY: `e` is NULL or an error the call made; its message is borrowed from it
        // until the free below.
        unsafe {
            let m = shardlimit_error_message(e);
            let message = if m.ptr.is_null() {
                String::new()
            } else {
                let bytes = std::slice::from_raw_parts(m.ptr.cast::<u8>(), m.len);
                String::from_utf8_lossy(bytes).into_owned()
            };
            shardlimit_error_free(e);
            (code, message)
        }
    }

    /// A `_start` call's result code and message; a refused one makes no pending.
    fn started(
        call: impl FnOnce(*mut *mut shardlimit_pending, *mut *mut shardlimit_error) -> shardlimit_result,
    ) -> (shardlimit_result, String) {
        let mut p = null_mut();
        let r = outcome(|e| call(&mut p, e));
        assert!(p.is_null(), "a refused _start made a pending");
        r
    }

    /// (what is wrong, limiter, key, policy handle, policy name)
    type Case<'a> = (
        &'a str,
        *const shardlimit_limiter,
        &'a [u8],
        *const shardlimit_policy,
        &'a [u8],
    );

    fn limiter() -> *mut shardlimit_limiter {
        let json = r#"{"policies":{"api":{"algorithm":"fixed_window","limit":2,"window":"1h","overrides":true}}}"#;
        let mut lim = null_mut();
        // SAFETY: the JSON is borrowed for the call, the out-parameter is ours.
        let rc = unsafe {
            shardlimit_limiter_new_json(
                json.as_ptr().cast(),
                json.len(),
                null(),
                &mut lim,
                null_mut(),
            )
        };
        assert_eq!(rc, SHARDLIMIT_OK);
        lim
    }

    #[test]
    fn both_forms_of_a_call_refuse_the_same_arguments_with_the_same_error() {
        unsafe {
            let lim = limiter();
            let freed = limiter();
            shardlimit_limiter_free(freed);
            let mut api = null_mut();
            let rc = shardlimit_limiter_policy(lim, c"api".as_ptr(), 3, &mut api, null_mut());
            assert_eq!(rc, SHARDLIMIT_OK);
            let long_key = vec![b'k'; MAX_KEY_LEN + 1];
            let long_name = vec![b'p'; SHARDLIMIT_POLICY_NAME_CAP];
            let not_a_policy: *const shardlimit_policy = lim.cast();
            // each bad in both the calls that take a handle and those that take a name
            let cases: &[Case] = &[
                ("a key too long", lim, &long_key, api, b"api"),
                ("a key with a NUL", lim, b"a\0b", api, b"api"),
                ("a key not UTF-8", lim, b"a\xffb", api, b"api"),
                ("no policy, a name too long", lim, b"k", null(), &long_name),
                (
                    "a limiter as the policy, a name not UTF-8",
                    lim,
                    b"k",
                    not_a_policy,
                    b"\xff",
                ),
                ("a freed limiter", freed, b"k", api, b"api"),
                ("a NULL limiter", null(), b"k", api, b"api"),
                // several wrong: the same one is named first
                ("everything", null(), &long_key, null(), &long_name),
                ("a key and the policy", lim, &long_key, null(), &long_name),
            ];
            let (cb, u) = (None, null_mut::<c_void>());
            for &(what, l, key, policy, name) in cases {
                let (k, kl) = (key.as_ptr().cast::<c_char>(), key.len());
                let (n, nl) = (name.as_ptr().cast::<c_char>(), name.len());
                let mut decision = std::mem::MaybeUninit::<shardlimit_decision>::uninit();
                let d = decision.as_mut_ptr();
                let mut found = false;
                let mut json = shardlimit_string {
                    ptr: null_mut(),
                    len: 0,
                };
                let pairs = [
                    (
                        "peek",
                        outcome(|e| shardlimit_peek(l, k, kl, policy, d, e)),
                        started(|p, e| shardlimit_peek_start(l, k, kl, policy, cb, u, p, e)),
                    ),
                    (
                        "reset",
                        outcome(|e| shardlimit_reset(l, k, kl, policy, e)),
                        started(|p, e| shardlimit_reset_start(l, k, kl, policy, cb, u, p, e)),
                    ),
                    (
                        "check",
                        outcome(|e| shardlimit_check(l, k, kl, policy, 1, d, e)),
                        started(|p, e| shardlimit_check_start(l, k, kl, policy, 1, cb, u, p, e)),
                    ),
                    (
                        "check_named",
                        outcome(|e| shardlimit_check_named(l, k, kl, n, nl, 1, d, e)),
                        started(|p, e| {
                            shardlimit_check_named_start(l, k, kl, n, nl, 1, cb, u, p, e)
                        }),
                    ),
                    (
                        "get_override",
                        outcome(|e| {
                            shardlimit_get_override(l, k, kl, n, nl, &mut found, &mut json, e)
                        }),
                        started(|p, e| shardlimit_get_override_start(l, k, kl, n, nl, cb, u, p, e)),
                    ),
                    (
                        "delete_override",
                        outcome(|e| shardlimit_delete_override(l, k, kl, n, nl, null_mut(), e)),
                        started(|p, e| {
                            shardlimit_delete_override_start(l, k, kl, n, nl, cb, u, p, e)
                        }),
                    ),
                ];
                for (call, blocking, start) in pairs {
                    assert_ne!(blocking.0, SHARDLIMIT_OK, "{call} with {what}");
                    assert_eq!(blocking, start, "{call} and {call}_start with {what}");
                }
            }
            shardlimit_policy_free(api);
            shardlimit_limiter_free(lim);
        }
    }
}
