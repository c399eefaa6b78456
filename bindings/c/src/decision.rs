//! The decision of a check as a C struct (`shardlimit_decision`), who made it
//! (`shardlimit_source`), and rendering it as HTTP headers, a 429 body or JSON.

use super::*;

/// Size of `shardlimit_decision.policy`: the longest policy name (128 bytes) plus its
/// terminating NUL.
pub const SHARDLIMIT_POLICY_NAME_CAP: usize = 129;

/// Size of `shardlimit_decision.quotas`: the most limits one policy may hold.
pub const SHARDLIMIT_MAX_LIMITS: usize = 16;

/// Who made a decision (`shardlimit_decision.source`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum shardlimit_source {
    /// A Redis shard ran the algorithm.
    SHARDLIMIT_SOURCE_REDIS = 1,
    /// The in-memory engine (no shards configured).
    SHARDLIMIT_SOURCE_MEMORY = 2,
    /// Admitted locally from units leased in advance from Redis.
    SHARDLIMIT_SOURCE_LOCAL = 3,
    /// The shard failed and the policy's `on_error` mode decided.
    SHARDLIMIT_SOURCE_FALLBACK = 4,
    /// The key is on the block list.
    SHARDLIMIT_SOURCE_BLOCK = 5,
    /// The shard failed and the policy's `on_error: local` decided with this process's
    /// share of the limit: a real (local) decision; a denial is a rate limit (429).
    SHARDLIMIT_SOURCE_LOCAL_FALLBACK = 6,
}

pub(crate) fn source_to_c(s: Source) -> shardlimit_source {
    match s {
        Source::Redis => SHARDLIMIT_SOURCE_REDIS,
        Source::Memory => SHARDLIMIT_SOURCE_MEMORY,
        Source::Local => SHARDLIMIT_SOURCE_LOCAL,
        Source::Fallback => SHARDLIMIT_SOURCE_FALLBACK,
        Source::Block => SHARDLIMIT_SOURCE_BLOCK,
        Source::LocalFallback => SHARDLIMIT_SOURCE_LOCAL_FALLBACK,
    }
}

pub(crate) fn source_from_c(code: u32) -> Option<Source> {
    [
        Source::Redis,
        Source::Memory,
        Source::Local,
        Source::Fallback,
        Source::Block,
        Source::LocalFallback,
    ]
    .into_iter()
    .find(|s| source_to_c(*s) as u32 == code)
}

/// The outcome of one check: a plain struct the caller allocates (usually on the stack)
/// and the library fills. Nothing inside it needs freeing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_decision {
    /// Whether the request may proceed. A denied check consumed nothing.
    pub allowed: bool,
    /// The effective limit (units per window, bucket capacity, or max concurrent).
    pub limit: u64,
    /// Units still available after this check.
    pub remaining: u64,
    /// Microseconds until the limit is back to its full budget with no further traffic.
    pub reset_after_us: u64,
    /// True when `retry_after_us` is set: the check was denied and can succeed later.
    /// False when allowed, and when the cost can never fit (cost > limit).
    pub has_retry_after: bool,
    /// When `has_retry_after`: microseconds until the same check would pass with no
    /// other traffic. 0 otherwise.
    pub retry_after_us: u64,
    /// Leaky bucket: microseconds the caller must wait before sending. 0 otherwise.
    pub delay_us: u64,
    /// The window the limit is measured over, in microseconds.
    pub window_us: u64,
    /// Who decided: a `shardlimit_source` value.
    pub source: u32,
    /// True when a Redis shard decided; `shard` is then its index.
    pub has_shard: bool,
    /// The index of the shard that decided (valid when `has_shard`).
    pub shard: u32,
    /// Length in bytes of `policy`, without its NUL.
    pub policy_len: usize,
    /// The policy that decided, NUL-terminated (for an ad-hoc limit, its generated name).
    pub policy: [c_char; SHARDLIMIT_POLICY_NAME_CAP],
    /// True for a layered check (`shardlimit_check_all()`); `layer` is then the index of
    /// the layer this decision describes: the one that denied, or the tightest when all
    /// allowed.
    pub has_layer: bool,
    /// The layer index (valid when `has_layer`).
    pub layer: u32,
    /// True for a multi-limit policy; `limit_index` is then the index of the limit this
    /// decision describes (the one that denied, or the tightest when all allowed), and
    /// `quotas[0..quota_count]` every limit in force, in the policy's order (what
    /// `RateLimit-Policy` lists: render headers with `shardlimit_decision_headers()`).
    pub has_limit_index: bool,
    /// The limit index (valid when `has_limit_index`).
    pub limit_index: u32,
    /// How many entries of `quotas` are set (0 for a policy of one limit).
    pub quota_count: u32,
    /// The limits of a multi-limit policy (the first `quota_count`).
    pub quotas: [shardlimit_quota; SHARDLIMIT_MAX_LIMITS],
    /// Shadow mode: the limit would have denied this check, but its policy (or the call,
    /// `shardlimit_check_shadow()`) is in shadow, so it was allowed (`allowed` is true,
    /// `has_retry_after` false) and consumed nothing. `remaining` is what the limit really
    /// has left.
    pub shadow_denied: bool,
}

/// One limit of a multi-limit policy as the headers describe it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct shardlimit_quota {
    /// The effective limit (units per window, or bucket capacity).
    pub limit: u64,
    /// The window it is measured over, in microseconds.
    pub window_us: u64,
}

pub(crate) fn decision_to_c(d: &Decision) -> Result<shardlimit_decision, Error> {
    let name = d.policy.as_bytes();
    if name.len() >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(CoreError::Internal(format!(
            "policy name of {} bytes does not fit shardlimit_decision.policy",
            name.len()
        ))
        .into());
    }
    let mut policy = [0 as c_char; SHARDLIMIT_POLICY_NAME_CAP];
    for (dst, src) in policy.iter_mut().zip(name) {
        *dst = *src as c_char;
    }
    let us = |t: Duration| u64::try_from(t.as_micros()).unwrap_or(u64::MAX);
    let mut quotas = [shardlimit_quota::default(); SHARDLIMIT_MAX_LIMITS];
    for (dst, q) in quotas.iter_mut().zip(&d.quotas) {
        *dst = shardlimit_quota {
            limit: q.limit,
            window_us: us(q.window),
        };
    }
    Ok(shardlimit_decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after_us: us(d.reset_after),
        has_retry_after: d.retry_after.is_some(),
        retry_after_us: d.retry_after.map(us).unwrap_or(0),
        shadow_denied: d.shadow_denied,
        delay_us: us(d.delay),
        window_us: us(d.window),
        source: source_to_c(d.source) as u32,
        has_shard: d.shard.is_some(),
        shard: d.shard.unwrap_or(0),
        policy_len: name.len(),
        policy,
        has_layer: d.layer.is_some(),
        layer: d.layer.map_or(0, |l| u32::try_from(l).unwrap_or(u32::MAX)),
        has_limit_index: d.limit_index.is_some(),
        limit_index: d.limit_index.map_or(0, |l| l as u32),
        quota_count: d.quotas.len().min(SHARDLIMIT_MAX_LIMITS) as u32,
        quotas,
    })
}

pub(crate) fn decision_from_c(p: *const shardlimit_decision) -> Result<Decision, Error> {
    let d = ref_arg("decision", p)?;
    if d.policy_len >= SHARDLIMIT_POLICY_NAME_CAP {
        return Err(invalid(
            "decision.policy_len",
            format!(
                "is {}; at most {} fit",
                d.policy_len,
                SHARDLIMIT_POLICY_NAME_CAP - 1
            ),
        ));
    }
    let policy = str_arg("decision.policy", d.policy.as_ptr(), d.policy_len)?;
    let source = source_from_c(d.source).ok_or_else(|| {
        invalid(
            "decision.source",
            format!("{} is not a shardlimit_source", d.source),
        )
    })?;
    let count = d.quota_count as usize;
    if count > SHARDLIMIT_MAX_LIMITS {
        return Err(invalid(
            "decision.quota_count",
            format!("is {count}; at most {SHARDLIMIT_MAX_LIMITS}"),
        ));
    }
    if d.has_limit_index && d.limit_index as usize >= count.max(1) {
        return Err(invalid(
            "decision.limit_index",
            format!("is {}; the decision has {count} quotas", d.limit_index),
        ));
    }
    let quotas = d.quotas[..count]
        .iter()
        .map(|q| shardlimit::Quota {
            limit: q.limit,
            window: Duration::from_micros(q.window_us),
        })
        .collect();
    Ok(Decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_after: Duration::from_micros(d.reset_after_us),
        retry_after: d
            .has_retry_after
            .then(|| Duration::from_micros(d.retry_after_us)),
        delay: Duration::from_micros(d.delay_us),
        policy: policy.into(),
        source,
        shard: d.has_shard.then_some(d.shard),
        window: Duration::from_micros(d.window_us),
        layer: d.has_layer.then_some(d.layer as usize),
        shadow_denied: d.shadow_denied,
        limit_index: d.has_limit_index.then_some(d.limit_index as usize),
        quotas,
        layers: Vec::new(),
    })
}

/// The stable name of a `shardlimit_source` value: `"redis"`, `"memory"`, `"local"`,
/// `"fallback"`, `"block"`, or `"unknown"`. Static, never freed. Thread-safe.
#[no_mangle]
pub extern "C" fn shardlimit_source_name(source: u32) -> shardlimit_str {
    quiet(shardlimit_str::EMPTY, || {
        static NAMES: LazyLock<Vec<(u32, CString)>> = LazyLock::new(|| {
            (1..=16)
                .filter_map(source_from_c)
                .map(|s| {
                    (
                        source_to_c(s) as u32,
                        CString::new(s.name()).expect("no NUL"),
                    )
                })
                .collect()
        });
        NAMES
            .iter()
            .find(|(c, _)| *c == source)
            .map(|(_, n)| shardlimit_str::from_cstring(n))
            .unwrap_or(shardlimit_str::from_static(c"unknown"))
    })
}

/// The rate-limit HTTP headers of a decision, from `shardlimit_decision_headers()`.
/// An opaque handle owned by the caller; free with `shardlimit_headers_free()`, once no
/// thread still reads the strings borrowed from it. Readable from any thread.
pub struct shardlimit_headers {
    pub(crate) items: Vec<(CString, CString)>,
}

// ---------------------------------------------------------------------------------------
// Rendering a decision

/// Renders the standard rate-limit response headers of `*decision` (as filled by a check),
/// in a stable order: `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`,
/// `RateLimit-Policy`, `RateLimit`, and `Retry-After` when denied and a retry can succeed.
/// `X-RateLimit-Reset` is the Unix time (seconds, rounded up) at which the budget is full
/// again, from the wall clock at this call (as every binding and middleware sends it);
/// `RateLimit`'s `t` and `Retry-After` are delta seconds.
///
/// On success `*out` is a new header list the caller owns: read it with
/// `shardlimit_headers_len()` / `shardlimit_headers_get()`, free it with
/// `shardlimit_headers_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (NULL pointers, or a decision struct not filled by a
/// check), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_headers(
    decision: *const shardlimit_decision,
    out: *mut *mut shardlimit_headers,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        let items = d
            .headers()
            .into_iter()
            .map(|(k, v)| (to_cstring(k.to_string()), to_cstring(v)))
            .collect();
        out.write(register(shardlimit_headers { items })?);
        Ok(())
    })
}

/// The number of headers in `headers`; 0 when it is NULL or not live. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_len(headers: *const shardlimit_headers) -> usize {
    quiet(0, || live("headers", headers).map_or(0, |h| h.items.len()))
}

/// The name and value of header number `index` (from 0). On success `*out_name` and
/// `*out_value` are set to strings borrowed from `headers`, valid until
/// `shardlimit_headers_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (NULL or freed `headers`, NULL outputs, index out of
/// range), INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_get(
    headers: *const shardlimit_headers,
    index: usize,
    out_name: *mut shardlimit_str,
    out_value: *mut shardlimit_str,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let out_name = out_arg("out_name", out_name)?;
        let out_value = out_arg("out_value", out_value)?;
        let h = live("headers", headers)?;
        let (name, value) = h
            .items
            .get(index)
            .map(|(k, v)| {
                (
                    shardlimit_str::from_cstring(k),
                    shardlimit_str::from_cstring(v),
                )
            })
            .ok_or_else(|| invalid("index", format!("{index} is out of range")))?;
        out_name.write(name);
        out_value.write(value);
        Ok(())
    })
}

/// Frees a header list. NULL, or a list already freed, is a no-op.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_headers_free(headers: *mut shardlimit_headers) {
    quiet((), || drop(unregister(headers)))
}

/// Renders the JSON body of a 429 response for `*decision`:
/// `{"error":"rate_limited","policy":...,"limit":...,"remaining":...,"retry_after":...,
/// "message":...}` with `retry_after` in whole seconds (null when the request can never
/// fit).
///
/// On success `*out` is a new string the caller owns; free it with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_body(
    decision: *const shardlimit_decision,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        out.write(owned_string(d.body().to_string()));
        Ok(())
    })
}

/// Renders `*decision` as one JSON object with durations in milliseconds (the form the
/// CLI prints and the shared test vectors use).
///
/// On success `*out` is a new string the caller owns; free it with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_decision_to_json(
    decision: *const shardlimit_decision,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let d = decision_from_c(decision)?;
        let out = out_arg("out", out)?;
        out.write(owned_string(d.to_json().to_string()));
        Ok(())
    })
}
