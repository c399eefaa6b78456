//! The block list: `shardlimit_block`, `_unblock`, `_blocked`.

use super::*;

/// A key's block-list entry, filled by `shardlimit_blocked()`.
#[repr(C)]
#[derive(Debug)]
pub struct shardlimit_block_info {
    /// Whether the key is blocked. When false, the other fields are zero/NULL.
    pub blocked: bool,
    /// True for a block without expiry (until `shardlimit_unblock()`).
    pub permanent: bool,
    /// Microseconds until the block expires (when not permanent).
    pub remaining_us: u64,
    /// The reason given to `shardlimit_block()`: owned by the caller, free it with
    /// `shardlimit_string_free(&info.reason)` (a no-op when `ptr` is NULL).
    pub reason: shardlimit_string,
}

/// Puts `key` on the block list for `ttl_ms` milliseconds (0: until unblocked), with a
/// `reason` (`reason_len` bytes of UTF-8, at most 1024; may be NULL with length 0). Every
/// limiter of every language sharing the shards sees it: checks of a blocked key are
/// denied with `source == SHARDLIMIT_SOURCE_BLOCK`.
///
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_block(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    ttl_ms: u64,
    reason: *const c_char,
    reason_len: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        if reason_len > 1024 {
            return Err(invalid("reason", "at most 1024 bytes"));
        }
        let reason = str_arg("reason", reason, reason_len)?;
        let ttl = (ttl_ms > 0).then(|| Duration::from_millis(ttl_ms));
        Ok(l.block_blocking(key, ttl, reason)?)
    })
}

/// Removes `key` from the block list. On success `*out_was_blocked` (may be NULL) says
/// whether it was blocked. Other processes notice within about a second (their block
/// cache). Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_unblock(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    out_was_blocked: *mut bool,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        let out_was_blocked = opt_out_arg("out_was_blocked", out_was_blocked)?;
        let was = l.unblock_blocking(key)?;
        if let Some(out_was_blocked) = out_was_blocked {
            out_was_blocked.write(was);
        }
        Ok(())
    })
}

/// The block-list entry of `key`. On success `*out` is filled; when `out->blocked`,
/// `out->reason` is an owned string the caller frees with `shardlimit_string_free()`.
/// Blocks for at most the configured deadline. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CONNECTION, TIMEOUT, SCRIPT, UNAVAILABLE, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_blocked(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    out: *mut shardlimit_block_info,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = blocking_limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        let out = out_arg("out", out)?;
        let info = block_info_to_c(l.blocked_blocking(key)?);
        out.write(info);
        Ok(())
    })
}

pub(crate) fn block_info_to_c(info: Option<BlockInfo>) -> shardlimit_block_info {
    match info {
        None => shardlimit_block_info {
            blocked: false,
            permanent: false,
            remaining_us: 0,
            reason: shardlimit_string {
                ptr: std::ptr::null_mut(),
                len: 0,
            },
        },
        Some(BlockInfo { reason, remaining }) => shardlimit_block_info {
            blocked: true,
            permanent: remaining.is_none(),
            remaining_us: remaining.map_or(0, |r| u64::try_from(r.as_micros()).unwrap_or(u64::MAX)),
            reason: owned_string(reason),
        },
    }
}
