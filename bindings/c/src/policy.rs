//! Policies (`shardlimit_policy`): looked up by name, ad hoc, from a rate string, or under
//! a plan.

use super::*;

/// The algorithm of an ad-hoc limit (`shardlimit_limit.algorithm`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_algorithm {
    /// At most `limit` units per aligned window of `period_ms`.
    SHARDLIMIT_ALGORITHM_FIXED_WINDOW = 1,
    /// Two-counter estimate of a sliding window of `period_ms`.
    SHARDLIMIT_ALGORITHM_SLIDING_WINDOW = 2,
    /// Exact sliding window of `period_ms` (one log entry per admitted check, carrying its cost).
    SHARDLIMIT_ALGORITHM_SLIDING_LOG = 3,
    /// A bucket of `limit` tokens refilled at `rate_per_sec`.
    SHARDLIMIT_ALGORITHM_TOKEN_BUCKET = 4,
    /// A shaper: a queue of `limit` units drained at `rate_per_sec`.
    SHARDLIMIT_ALGORITHM_LEAKY_BUCKET = 5,
    /// At most `limit` units held at once; leases expire after `period_ms`.
    SHARDLIMIT_ALGORITHM_CONCURRENCY = 6,
}

/// What an ad-hoc policy does when its Redis shard fails (`shardlimit_limit.on_error`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_on_error {
    /// The core's default (`open`).
    SHARDLIMIT_ON_ERROR_DEFAULT = 0,
    /// Allow the request.
    SHARDLIMIT_ON_ERROR_OPEN = 1,
    /// Deny the request.
    SHARDLIMIT_ON_ERROR_CLOSED = 2,
    /// Decide with an in-process limiter holding `limit / instances`.
    SHARDLIMIT_ON_ERROR_LOCAL = 3,
    /// Return the backend error to the caller, who decides.
    SHARDLIMIT_ON_ERROR_ERROR = 4,
}

/// The parameters of an ad-hoc limit, for `shardlimit_policy_new()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_limit {
    /// A `shardlimit_algorithm` value.
    pub algorithm: u32,
    /// Units per window (windows), capacity (buckets) or max held (concurrency).
    pub limit: u64,
    /// The window (fixed_window, sliding_window, sliding_log) or the lease TTL
    /// (concurrency), in whole milliseconds. Ignored by the buckets.
    pub period_ms: u64,
    /// Refill rate (token_bucket) or leak rate (leaky_bucket) in units per second.
    /// Ignored by the other algorithms.
    pub rate_per_sec: f64,
    /// A `shardlimit_on_error` value; 0 for the default.
    pub on_error: u32,
}

/// A validated policy (a named limit). Immutable and thread-safe. From
/// `shardlimit_limiter_policy()` or `shardlimit_policy_new()`; an opaque handle the caller
/// owns and frees with `shardlimit_policy_free()` (a call using it on another thread then
/// finishes; later ones return CLOSED).
pub struct shardlimit_policy {
    pub(crate) policy: Policy,
    /// The name again, NUL-terminated for `shardlimit_policy_name()`.
    pub(crate) name: CString,
}

pub(crate) fn new_policy(policy: Policy) -> Result<*mut shardlimit_policy, Error> {
    let name = to_cstring(policy.name().to_string());
    register(shardlimit_policy { policy, name })
}

/// The algorithm of a `shardlimit_algorithm` value.
pub(crate) fn algorithm_from_c(a: u32) -> Result<shardlimit::Algorithm, Error> {
    use shardlimit::Algorithm as A;
    use shardlimit_algorithm::*;
    Ok(match a {
        a if a == SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32 => A::FixedWindow,
        a if a == SHARDLIMIT_ALGORITHM_SLIDING_WINDOW as u32 => A::SlidingWindow,
        a if a == SHARDLIMIT_ALGORITHM_SLIDING_LOG as u32 => A::SlidingLog,
        a if a == SHARDLIMIT_ALGORITHM_TOKEN_BUCKET as u32 => A::TokenBucket,
        a if a == SHARDLIMIT_ALGORITHM_LEAKY_BUCKET as u32 => A::LeakyBucket,
        a if a == SHARDLIMIT_ALGORITHM_CONCURRENCY as u32 => A::Concurrency,
        a => {
            return Err(invalid(
                "algorithm",
                format!("{a} is not a shardlimit_algorithm"),
            ))
        }
    })
}

// ---------------------------------------------------------------------------------------
// Policies

/// Looks up the policy named by `name_len` bytes at `name` in the limiter's configuration.
///
/// On success `*out` is a new policy object the caller owns (free with
/// `shardlimit_policy_free()`); it stays valid after the limiter is freed. `err` may be
/// NULL. Thread-safe.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_limiter_policy(
    limiter: *const shardlimit_limiter,
    name: *const c_char,
    name_len: usize,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let name = policy_name_arg(name, name_len)?;
        let out = out_arg("out", out)?;
        let policy = l.policy(name)?;
        out.write(new_policy(policy)?);
        Ok(())
    })
}

/// Creates an ad-hoc policy named by `name_len` bytes at `name` (letters, digits,
/// `_ - .`, at most 128 bytes; it appears in Redis key names and headers) enforcing
/// `*limit` (read, not retained).
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, CONFIG (a parameter is out of range; the message names it),
/// INVALID_ARGUMENT (NULL `limit` or `out`, unknown algorithm or on_error), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_new(
    name: *const c_char,
    name_len: usize,
    limit: *const shardlimit_limit,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let name = str_arg("name", name, name_len)?;
        if limit.is_null() || !limit.is_aligned() {
            return Err(invalid("limit", "is NULL or misaligned"));
        }
        let out = out_arg("out", out)?;
        let l = ref_arg("limit", limit)?;
        let period = Duration::from_millis(l.period_ms);
        use shardlimit_algorithm::*;
        let lim = match l.algorithm {
            a if a == SHARDLIMIT_ALGORITHM_FIXED_WINDOW as u32 => {
                Limit::fixed_window(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_SLIDING_WINDOW as u32 => {
                Limit::sliding_window(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_SLIDING_LOG as u32 => {
                Limit::sliding_log(l.limit, period)
            }
            a if a == SHARDLIMIT_ALGORITHM_TOKEN_BUCKET as u32 => {
                Limit::token_bucket(l.limit, l.rate_per_sec)
            }
            a if a == SHARDLIMIT_ALGORITHM_LEAKY_BUCKET as u32 => {
                Limit::leaky_bucket(l.limit, l.rate_per_sec)
            }
            a if a == SHARDLIMIT_ALGORITHM_CONCURRENCY as u32 => {
                Limit::concurrency(l.limit, period)
            }
            a => {
                return Err(invalid(
                    "limit.algorithm",
                    format!("{a} is not a shardlimit_algorithm"),
                ))
            }
        };
        use shardlimit_on_error::*;
        let on_error = match l.on_error {
            e if e == SHARDLIMIT_ON_ERROR_DEFAULT as u32 => None,
            e if e == SHARDLIMIT_ON_ERROR_OPEN as u32 => Some(OnError::Open),
            e if e == SHARDLIMIT_ON_ERROR_CLOSED as u32 => Some(OnError::Closed),
            e if e == SHARDLIMIT_ON_ERROR_LOCAL as u32 => Some(OnError::Local),
            e if e == SHARDLIMIT_ON_ERROR_ERROR as u32 => Some(OnError::Error),
            e => {
                return Err(invalid(
                    "limit.on_error",
                    format!("{e} is not a shardlimit_on_error"),
                ))
            }
        };
        let mut policy = Policy::new(name, lim)?;
        if let Some(mode) = on_error {
            policy = policy.with_on_error(mode);
        }
        out.write(new_policy(policy)?);
        Ok(())
    })
}

/// Creates a policy from a rate string: `rate_len` bytes of UTF-8 at `rate` in the
/// `limits` package's syntax (`"5/minute"`, `"10/second; 1000/day"`: several limits make
/// a multi-limit policy, checked together in one call), each limit of `algorithm` (a
/// `shardlimit_algorithm`, not CONCURRENCY). Named by `name_len` bytes at `name` (the rules
/// of `shardlimit_policy_new()`), or, when `name_len` is 0, after its limits.
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, INVALID_ARGUMENT (a bad rate string: the message quotes the bad part;
/// NULL `out`, unknown algorithm), CONFIG (a limit out of range, or a bad name), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_new_rate(
    name: *const c_char,
    name_len: usize,
    rate: *const c_char,
    rate_len: usize,
    algorithm: u32,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let rate = str_arg("rate", rate, rate_len)?;
        let out = out_arg("out", out)?;
        let algorithm = algorithm_from_c(algorithm)?;
        let policy = if name_len == 0 {
            Policy::from_rate(rate, algorithm)?
        } else {
            let name = str_arg("name", name, name_len)?;
            let limits = shardlimit::parse_rate_as(rate, algorithm)?;
            Policy::multi(name, limits)?
        };
        out.write(new_policy(policy)?);
        Ok(())
    })
}

/// Looks up the policy named by `name_len` bytes at `name` as plan `plan_len` bytes at
/// `plan` of the limiter's configuration has it: the plan's limits under the policy's
/// name (same keys and headers), or the policy itself when the plan does not list it.
/// Check under a plan by passing `*out` to `shardlimit_check()`.
///
/// On success `*out` is a new policy the caller owns (free with
/// `shardlimit_policy_free()`). `err` may be NULL. Thread-safe.
/// Results: OK, UNKNOWN_POLICY, INVALID_ARGUMENT (no such plan), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_plan_policy(
    limiter: *const shardlimit_limiter,
    plan: *const c_char,
    plan_len: usize,
    name: *const c_char,
    name_len: usize,
    out: *mut *mut shardlimit_policy,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let plan = str_arg("plan", plan, plan_len)?;
        let name = policy_name_arg(name, name_len)?;
        let out = out_arg("out", out)?;
        out.write(new_policy(l.plan_policy(plan, name)?)?);
        Ok(())
    })
}

/// The policy's name. Borrowed from `policy`: valid until `shardlimit_policy_free()`.
/// An empty string when `policy` is NULL or not live. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_name(
    policy: *const shardlimit_policy,
) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        live("policy", policy).map_or(shardlimit_str::EMPTY, |p| {
            shardlimit_str::from_cstring(&p.name)
        })
    })
}

/// Frees a policy object. NULL, or a policy already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_policy_free(policy: *mut shardlimit_policy) {
    quiet((), || drop(unregister(policy)))
}
