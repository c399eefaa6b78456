//! Result codes and errors: `shardlimit_result`, the `shardlimit_error` object, and the
//! panic guard every entry point runs in.

use super::*;

/// The result of every fallible function. The numbers are a stable public contract
/// shared with the core crate's `ErrorKind` codes (and so with the Python exception
/// classes and the Node `err.code` values), except the codes from 100 on, which only the
/// C ABI has: a retired number is never reused.
/// `shardlimit_result_name()` gives each code's stable snake_case name.
///
/// A denied check is not an error: it returns `SHARDLIMIT_OK` with `allowed == false`.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_result {
    /// Success; out-parameters were written.
    SHARDLIMIT_OK = 0,
    /// The configuration is invalid; the message names the offending field.
    SHARDLIMIT_ERR_CONFIG = 1,
    /// An argument is invalid: NULL where a value is required, not UTF-8, a NUL byte
    /// inside a key (usually a wrong length), an empty or too long key, a zero cost, a
    /// freed or foreign handle, an index out of range.
    SHARDLIMIT_ERR_INVALID_ARGUMENT = 2,
    /// A Redis shard could not be reached or the connection broke.
    SHARDLIMIT_ERR_CONNECTION = 3,
    /// A Redis shard did not answer within the configured deadline (`timeout_ms`).
    SHARDLIMIT_ERR_TIMEOUT = 4,
    /// Redis answered with an error while running a script or command.
    SHARDLIMIT_ERR_SCRIPT = 5,
    // 6 was SHARDLIMIT_ERR_ROUTING, retired unused; never reused.
    /// A named policy does not exist in the configuration.
    SHARDLIMIT_ERR_UNKNOWN_POLICY = 7,
    /// Reading a file (the configuration) failed.
    SHARDLIMIT_ERR_IO = 8,
    /// A bug in shardlimit (an invariant broke, or a panic was caught). Please report it.
    SHARDLIMIT_ERR_INTERNAL = 9,
    /// A shard's circuit breaker is open after repeated failures: it is skipped (no time
    /// spent) until a background probe sees it answer again.
    SHARDLIMIT_ERR_UNAVAILABLE = 10,
    /// More checks wait for a shard's connection in this process than its queue holds
    /// (`max_queue`): the check was refused, neither admitted nor sent to `on_error`.
    SHARDLIMIT_ERR_OVERLOADED = 11,
    /// The handle was freed (`shardlimit_limiter_free()` and the like): a use after free,
    /// or a call racing the free on another thread. Handles are never reused, so a freed
    /// handle always gives CLOSED, never another object's answer. Codes from 100 on belong
    /// to the C ABI (handles exist only here) and never collide with the core's kinds.
    SHARDLIMIT_ERR_CLOSED = 100,
    /// The call was cancelled (`shardlimit_pending_cancel()`) before it completed. The C
    /// ABI's own code, like CLOSED.
    SHARDLIMIT_ERR_CANCELLED = 101,
}

/// A failure of an ABI call: a result code and its message. Core errors convert with `?`;
/// CLOSED is the ABI's own.
#[derive(Debug, Clone)]
pub(crate) struct Error {
    pub(crate) code: shardlimit_result,
    pub(crate) message: String,
}

impl From<CoreError> for Error {
    fn from(e: CoreError) -> Error {
        Error {
            code: shardlimit_result::from_kind(e.kind()),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl shardlimit_result {
    /// The C code of a core error kind. Kinds added to the core later map to INTERNAL
    /// until they get their own code here; `tests::errors::result_codes_match_the_core` fails
    /// until they do.
    pub(crate) fn from_kind(kind: ErrorKind) -> shardlimit_result {
        match kind {
            ErrorKind::Config => SHARDLIMIT_ERR_CONFIG,
            ErrorKind::InvalidArgument => SHARDLIMIT_ERR_INVALID_ARGUMENT,
            ErrorKind::Connection => SHARDLIMIT_ERR_CONNECTION,
            ErrorKind::Timeout => SHARDLIMIT_ERR_TIMEOUT,
            ErrorKind::Script => SHARDLIMIT_ERR_SCRIPT,
            ErrorKind::UnknownPolicy => SHARDLIMIT_ERR_UNKNOWN_POLICY,
            ErrorKind::Io => SHARDLIMIT_ERR_IO,
            ErrorKind::Internal => SHARDLIMIT_ERR_INTERNAL,
            ErrorKind::Unavailable => SHARDLIMIT_ERR_UNAVAILABLE,
            ErrorKind::Overloaded => SHARDLIMIT_ERR_OVERLOADED,
            _ => SHARDLIMIT_ERR_INTERNAL,
        }
    }
}

/// The details of a failure: its result code and a message naming what went wrong.
/// An opaque handle owned by the caller; free with `shardlimit_error_free()`. Readable
/// from any thread; its message is borrowed from it, so free it only when no thread still
/// reads the message.
pub struct shardlimit_error {
    pub(crate) code: shardlimit_result,
    pub(crate) message: CString,
}

pub(crate) fn invalid(what: &str, message: impl Into<String>) -> Error {
    CoreError::InvalidArgument {
        what: what.to_string(),
        message: message.into(),
    }
    .into()
}

// ---------------------------------------------------------------------------------------
// The panic guard every fallible entry point runs in.

pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// Runs `f`, turning its error or panic into a result code and, when `err` is not NULL, an
/// owned `shardlimit_error`. `f` writes its out-parameters only as its last step, after
/// everything that can fail.
pub(crate) fn guard(
    err: *mut *mut shardlimit_error,
    f: impl FnOnce() -> Result<(), Error>,
) -> shardlimit_result {
    let (code, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return SHARDLIMIT_OK,
        Ok(Err(e)) => (e.code, e.message),
        Err(payload) => (
            SHARDLIMIT_ERR_INTERNAL,
            format!(
                "internal error (a bug in shardlimit): panic: {}",
                panic_message(&*payload)
            ),
        ),
    };
    if let Ok(Some(out)) = opt_out_arg("err", err) {
        let reported = catch_unwind(AssertUnwindSafe(|| {
            register(shardlimit_error {
                code,
                message: to_cstring(message),
            })
        }));
        if let Ok(Ok(e)) = reported {
            out.write(e);
        }
    }
    code
}

/// Runs an infallible function body, returning `fallback` if it panics.
pub(crate) fn quiet<R>(fallback: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// The stable snake_case name of a result code: `"ok"`, `"config"`, `"invalid_argument"`,
/// `"connection"`, `"timeout"`, `"script"`, `"unknown_policy"`, `"io"`, `"internal"`,
/// `"unavailable"`, `"closed"`, `"cancelled"`, or `"unknown"` for a number that is not a
/// code. Static, never freed.
/// Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_name(code: u32) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        if code == SHARDLIMIT_OK as u32 {
            return shardlimit_str::from_static(c"ok");
        }
        if code == SHARDLIMIT_ERR_CLOSED as u32 {
            return shardlimit_str::from_static(c"closed");
        }
        if code == SHARDLIMIT_ERR_CANCELLED as u32 {
            return shardlimit_str::from_static(c"cancelled");
        }
        static NAMES: LazyLock<Vec<(u32, CString)>> = LazyLock::new(|| {
            ErrorKind::ALL
                .iter()
                .map(|k| (k.code(), CString::new(k.name()).expect("no NUL")))
                .collect()
        });
        NAMES
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, n)| shardlimit_str::from_cstring(n))
            .unwrap_or(shardlimit_str::from_static(c"unknown"))
    })
}

/// True for the codes that mean "the backend (Redis) failed" rather than "the caller
/// made a mistake": CONNECTION, TIMEOUT, SCRIPT and UNAVAILABLE (`spec/errors.json`,
/// `"backend": true`). These are the failures a service may
/// choose to fail open on. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_is_backend(code: u32) -> bool {
    quiet(false, || {
        ErrorKind::ALL
            .iter()
            .any(|k| k.code() == code && k.is_backend())
    })
}

/// The code of the more general kind `code` is a special case of, or 0 when it has none
/// (or is not a code): `SHARDLIMIT_ERR_UNKNOWN_POLICY` is an `SHARDLIMIT_ERR_INVALID_ARGUMENT`
/// (the hierarchy of `spec/errors.json`), so a caller that handles invalid arguments
/// handles unknown policies too. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_result_parent(code: u32) -> u32 {
    quiet(0, || {
        ErrorKind::ALL
            .iter()
            .find(|k| k.code() == code)
            .and_then(|k| k.parent())
            .map_or(0, |p| p.code())
    })
}

/// The result code of an error. `SHARDLIMIT_ERR_CLOSED` when `err` was freed already,
/// `SHARDLIMIT_ERR_INVALID_ARGUMENT` when it is NULL or not an error. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_code(err: *const shardlimit_error) -> shardlimit_result {
    quiet(SHARDLIMIT_ERR_INVALID_ARGUMENT, || match live("err", err) {
        Ok(e) => e.code,
        Err(e) => e.code,
    })
}

/// The human-readable message of an error, naming the field or argument at fault (for
/// example `policies.login.window: expected a duration ...`). Borrowed from `err`: valid
/// until `shardlimit_error_free(err)`. An empty string when `err` is NULL or not a live
/// error. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_message(err: *const shardlimit_error) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        live("err", err).map_or(shardlimit_str::EMPTY, |e| {
            shardlimit_str::from_cstring(&e.message)
        })
    })
}

/// Frees an error from any function's `err` out-parameter. NULL, an error already freed
/// (a double free) or a pointer that is not an error is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_error_free(err: *mut shardlimit_error) {
    quiet((), || drop(unregister(err)))
}
