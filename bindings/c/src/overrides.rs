//! Live per-key overrides (`Limiter::set_override` and its kin): the limit of one key under
//! one policy, changed at run time. Values cross as JSON text, the shape the CLI prints
//! (`OverrideInfo::to_json`): `{"key", "policy", "limit": {...}, "remaining_ms": n | null}`.

use super::*;

/// A limit argument: at most 64 KiB of UTF-8.
pub(crate) fn limit_arg<'a>(ptr: *const c_char, len: usize) -> Result<&'a str, Error> {
    if len > 64 << 10 {
        return Err(invalid(
            "limit",
            format!("is {len} bytes long; at most 65536"),
        ));
    }
    str_arg("limit", ptr, len)
}

/// A cursor of `list_overrides` (at most 4 KiB): none for the first page (NULL, or empty).
pub(crate) fn cursor_arg<'a>(ptr: *const c_char, len: usize) -> Result<Option<&'a str>, Error> {
    if len > 4096 {
        return Err(invalid(
            "cursor",
            "is longer than any cursor list_overrides returns",
        ));
    }
    let cursor = str_arg("cursor", ptr, len)?;
    Ok((!cursor.is_empty()).then_some(cursor))
}

fn json_string(v: serde_json::Value) -> shardlimit_string {
    owned_string(v.to_string())
}

/// Sets `key`'s override of `policy` (a config policy with `"overrides": true`) to `limit`
/// (`limit_len` bytes of UTF-8): a rate string (`"100/minute"`, in the policy's
/// algorithm) or a limit object in JSON as in a config policy. For `ttl_ms` milliseconds
/// (0: until deleted). Every limiter of every language sharing the shards decides the
/// key's next check with it. All inputs are borrowed for the call only.
///
/// On success, when `out_json` is not NULL, `*out_json` is the override as JSON, an owned
/// string the caller frees with `shardlimit_string_free()`. Blocks for at most the
/// configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a policy without overrides, a bad limit or TTL),
/// UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn shardlimit_set_override(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    limit: *const c_char,
    limit_len: usize,
    ttl_ms: u64,
    out_json: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) =
            named_args(Form::Blocking, limiter, key, key_len, policy, policy_len)?;
        let limit = limit_arg(limit, limit_len)?;
        let out_json = opt_out_arg("out_json", out_json)?;
        let ttl = (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms));
        let info = l.set_override_blocking(key, policy, limit, ttl)?;
        if let Some(out_json) = out_json {
            out_json.write(json_string(info.to_json()));
        }
        Ok(())
    })
}

/// `key`'s override of `policy`. On success `*out_found` says whether it has one; when it
/// does, `*out_json` is the override as JSON (an owned string the caller frees with
/// `shardlimit_string_free()`), else an empty struct (NULL `ptr`). Neither may be NULL.
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT (an entry in
/// Redis that shardlimit did not write), UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_get_override(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    out_found: *mut bool,
    out_json: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) =
            named_args(Form::Blocking, limiter, key, key_len, policy, policy_len)?;
        let out_found = out_arg("out_found", out_found)?;
        let out_json = out_arg("out_json", out_json)?;
        let info = l.get_override_blocking(key, policy)?;
        out_found.write(info.is_some());
        out_json.write(match info {
            Some(i) => json_string(i.to_json()),
            None => shardlimit_string {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        });
        Ok(())
    })
}

/// Deletes `key`'s override of `policy`; its next check, in every limiter, is decided by
/// the policy's own limit. On success `*out_deleted` (may be NULL) says whether it had
/// one. Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_delete_override(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    policy: *const c_char,
    policy_len: usize,
    out_deleted: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let (l, key, policy) =
            named_args(Form::Blocking, limiter, key, key_len, policy, policy_len)?;
        let out_deleted = opt_out_arg("out_deleted", out_deleted)?;
        let deleted = l.delete_override_blocking(key, policy)?;
        if let Some(out_deleted) = out_deleted {
            out_deleted.write(deleted);
        }
        Ok(())
    })
}

/// One page of `policy`'s overrides on every shard, about `limit` of them (1 to 10000):
/// `cursor` (`cursor_len` bytes; NULL with length 0 for the first page) is the previous
/// page's. On success `*out_json` (not NULL) is `{"overrides": [...], "cursor": "..." |
/// null}` (null: the last page), an owned string the caller frees with
/// `shardlimit_string_free()`. Not on a Redis Cluster yet (INVALID_ARGUMENT).
/// Blocks for at most the configured deadline per shard call. Thread-safe. `err` may be
/// NULL. Results: OK, INVALID_ARGUMENT, UNKNOWN_POLICY, CONNECTION, TIMEOUT, SCRIPT,
/// UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_list_overrides(
    limiter: *const shardlimit_limiter,
    policy: *const c_char,
    policy_len: usize,
    cursor: *const c_char,
    cursor_len: usize,
    limit: usize,
    out_json: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let policy = policy_name_arg(policy, policy_len)?;
        let cursor = cursor_arg(cursor, cursor_len)?;
        let out_json = out_arg("out_json", out_json)?;
        let page = l.list_overrides_blocking(policy, cursor, limit)?;
        out_json.write(json_string(page.to_json()));
        Ok(())
    })
}
