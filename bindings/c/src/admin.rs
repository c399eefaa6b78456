//! The limiter's operations besides checks: engine and routing, reload, scale, health,
//! metrics. None of them waits for Redis.

use super::*;

/// The bytes of a path argument, as a path (not UTF-8 on Unix).
pub(crate) fn path_arg(path: *const c_char, path_len: usize) -> Result<std::path::PathBuf, Error> {
    let bytes = bytes_arg("path", path, path_len)?;
    if bytes.is_empty() {
        return Err(invalid("path", "is empty"));
    }
    if bytes.contains(&0) {
        return Err(invalid("path", "contains a NUL byte: is the length right?"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }
    #[cfg(not(unix))]
    Ok(std::path::PathBuf::from(str_arg("path", path, path_len)?))
}

/// Whether the limiter decides on Redis (true) or in memory (false); false for NULL or a
/// handle that is not a live limiter. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_is_redis(limiter: *const shardlimit_limiter) -> bool {
    quiet(false, || limiter_arg(limiter).is_ok_and(|l| l.is_redis()))
}

/// How many keys the in-memory engine holds: on success `*out_count` is set and
/// `*out_has` (may be NULL) is true, or, on Redis (which holds no keys here), `*out_count`
/// is 0 and `*out_has` false. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_memory_keys(
    limiter: *const shardlimit_limiter,
    out_has: *mut bool,
    out_count: *mut usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out_count = out_arg("out_count", out_count)?;
        let out_has = opt_out_arg("out_has", out_has)?;
        let n = l.memory_keys();
        out_count.write(n.unwrap_or(0));
        if let Some(out_has) = out_has {
            out_has.write(n.is_some());
        }
        Ok(())
    })
}

/// The shard the key given by `key_len` bytes at `key` routes to (the public routing
/// contract: jump hash of xxh64 of the hash tag or key). On success `*out_index` is its
/// index and `*out_name` (may be NULL) its name, an owned string the caller frees with
/// `shardlimit_string_free()`. On the in-memory engine there is no shard: INVALID_ARGUMENT.
/// Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_route(
    limiter: *const shardlimit_limiter,
    key: *const c_char,
    key_len: usize,
    out_index: *mut u32,
    out_name: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let key = key_arg(key, key_len)?;
        let out_index = out_arg("out_index", out_index)?;
        let out_name = opt_out_arg("out_name", out_name)?;
        let (i, name) = l.route(key).ok_or_else(|| {
            invalid(
                "limiter",
                "decides in memory: there are no shards to route to",
            )
        })?;
        out_index.write(i);
        if let Some(out_name) = out_name {
            out_name.write(owned_string(name));
        }
        Ok(())
    })
}

/// Applies a new JSON configuration (`json_len` bytes at `json`, not retained) to the
/// running limiter: checks in flight finish on the old one, new checks use the new one;
/// connections are kept when the shard list is unchanged, counters where policies stay.
/// A bad configuration is refused with the reason and the old one stays in force.
/// Thread-safe. `err` may be NULL.
/// Results: OK, CONFIG, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_reload(
    limiter: *const shardlimit_limiter,
    json: *const c_char,
    json_len: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let text = bytes_arg("json", json, json_len)?;
        let text = std::str::from_utf8(text).map_err(|e| CoreError::Config {
            field: "config".to_string(),
            message: format!("not valid UTF-8 (at byte {})", e.valid_up_to()),
        })?;
        l.reload(shardlimit::Config::from_json(text)?)?;
        Ok(())
    })
}

/// `shardlimit_reload()` from the configuration file at the path given by `path_len`
/// bytes at `path`. Thread-safe. `err` may be NULL.
/// Results: OK, IO, CONFIG, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_reload_from_file(
    limiter: *const shardlimit_limiter,
    path: *const c_char,
    path_len: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let p = path_arg(path, path_len)?;
        l.reload_from_file(&p)?;
        Ok(())
    })
}

/// Scales limits by `factor` (0 < factor <= 1): every policy when `count` is 0, else the
/// `count` policies named in `policies` (an array of strings, borrowed for the call).
/// Decisions and headers then report the effective limit. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (a factor out of range), UNKNOWN_POLICY, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_set_scale(
    limiter: *const shardlimit_limiter,
    factor: f64,
    policies: *const shardlimit_str,
    count: usize,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        if count > MAX_LAYERS_READ {
            return Err(invalid("count", format!("{count} is implausible")));
        }
        let raw = slice_arg("policies", policies, count)?;
        let names = raw
            .iter()
            .enumerate()
            .map(|(i, s)| str_arg(&format!("policies[{i}]"), s.ptr, s.len))
            .collect::<Result<Vec<&str>, Error>>()?;
        Ok(l.set_scale(factor, &names)?)
    })
}

/// The global scale factor in force (1 unless `shardlimit_set_scale()` changed it); 0 for
/// NULL or a handle that is not a live limiter. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_scale(limiter: *const shardlimit_limiter) -> f64 {
    quiet(0.0, || limiter_arg(limiter).map_or(0.0, |l| l.scale()))
}

/// Installs the core's latency scale hook (`latency_scale`): full limits while the health
/// signal (seconds) is at or under `target_us` microseconds, proportionally less above it
/// (target / signal), never below `min_factor`. `shardlimit_observe_health()` feeds it.
/// (A hook of the caller's own is a Rust closure: C callers compute the factor themselves
/// and call `shardlimit_set_scale()`.) Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_set_latency_scale(
    limiter: *const shardlimit_limiter,
    target_us: u64,
    min_factor: f64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        if !(min_factor > 0.0 && min_factor <= 1.0) {
            return Err(invalid("min_factor", "must be in (0, 1]"));
        }
        l.set_scale_hook(shardlimit::latency_scale(
            Duration::from_micros(target_us),
            min_factor,
        ));
        Ok(())
    })
}

/// Feeds a health signal (e.g. the p99 latency of the protected dependency, in seconds)
/// to the scale hook and applies the factor it gives; on success `*out_factor` (may be
/// NULL) is the factor now in force. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT (no hook installed), CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_observe_health(
    limiter: *const shardlimit_limiter,
    signal: f64,
    out_factor: *mut f64,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out_factor = opt_out_arg("out_factor", out_factor)?;
        let f = l.observe_health(signal)?;
        if let Some(out_factor) = out_factor {
            out_factor.write(f);
        }
        Ok(())
    })
}

/// The limiter's counters as JSON: `{"policies":[{"policy":..,"allowed":..,"denied":..,
/// "fallback":..,"blocked":..,"local_admitted":..,"redis_errors":..,"shadow_denied":..,
/// "near_limit":..}],
/// "redis_latency":{"buckets_le_us":[..],"buckets":[..],"sum_us":..,"count":..},
/// "events_dropped":..}`. On success `*out` is an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_metrics(
    limiter: *const shardlimit_limiter,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out = out_arg("out", out)?;
        let m = l.metrics();
        let policies: Vec<serde_json::Value> = m
            .policies
            .iter()
            .map(|p| {
                serde_json::json!({
                    "policy": p.policy, "allowed": p.allowed, "denied": p.denied,
                    "fallback": p.fallback, "blocked": p.blocked,
                    "local_admitted": p.local_admitted, "redis_errors": p.redis_errors,
                    "shadow_denied": p.shadow_denied, "near_limit": p.near_limit,
                })
            })
            .collect();
        let json = serde_json::json!({
            "policies": policies,
            "redis_latency": {
                "buckets_le_us": shardlimit::metrics::LATENCY_BUCKETS_US,
                "buckets": m.redis_latency.buckets,
                "sum_us": m.redis_latency.sum_us,
                "count": m.redis_latency.count,
            },
            "events_dropped": m.events_dropped,
        });
        out.write(owned_string(json.to_string()));
        Ok(())
    })
}

/// The limiter's counters in the Prometheus text exposition format (version 0.0.4), for
/// a `/metrics` endpoint. On success `*out` is an owned string the caller frees with
/// `shardlimit_string_free()`. Thread-safe. `err` may be NULL.
/// Results: OK, INVALID_ARGUMENT, CLOSED, INTERNAL.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_metrics_prometheus(
    limiter: *const shardlimit_limiter,
    out: *mut shardlimit_string,
    err: *mut *mut shardlimit_error,
) -> shardlimit_result {
    guard(err, || {
        let l = limiter_arg(limiter)?;
        let out = out_arg("out", out)?;
        out.write(owned_string(l.metrics().to_prometheus()));
        Ok(())
    })
}
