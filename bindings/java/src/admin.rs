//! Running a limiter: the config, policies, routing and metrics (`Native.info`), reload
//! and config watching, scaling.

use super::*;

/// What `Native.info` answers, as JSON text.
const INFO_CONFIG: jint = 0;
const INFO_POLICY: jint = 1;
const INFO_PLAN_POLICY: jint = 2;
const INFO_ROUTE: jint = 3;
const INFO_METRICS: jint = 4;
const INFO_METRICS_SNAPSHOT: jint = 5;
const INFO_STATE: jint = 6;

/// Synchronous questions to the limiter, answered as JSON (or Prometheus) text.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_info(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    what: jint,
    a: JByteArray,
    b: JByteArray,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let l = limiter(h)?;
        let v = match what {
            INFO_CONFIG => {
                let c = l.config();
                let shards: Vec<String> = match &c.shards {
                    Some(s) => s.iter().map(|s| s.name.clone()).collect(),
                    None => Vec::new(),
                };
                json!({
                    "engine": if l.is_redis() { "redis" } else { "memory" },
                    "shards": shards,
                    "cluster": c.cluster.as_ref().map(|n| n.len()),
                    "key_prefix": c.key_prefix,
                    "timeout_ms": ms(c.timeout),
                    "on_error": c.on_error.name(),
                    "instances": c.instances,
                    "policies": c.policies.values().map(policy_json).collect::<Vec<_>>(),
                })
            }
            INFO_POLICY => policy_json(&l.policy(&text(env, &a, "policy")?)?),
            INFO_PLAN_POLICY => {
                policy_json(&l.plan_policy(&text(env, &a, "plan")?, &text(env, &b, "policy")?)?)
            }
            INFO_ROUTE => match l.route(&text(env, &a, "key")?) {
                Some((index, name)) => json!({"index": index, "name": name}),
                None => Value::Null,
            },
            INFO_METRICS => return jstr(env, l.metrics().to_prometheus()),
            INFO_METRICS_SNAPSHOT => {
                let m = l.metrics();
                let policies: Vec<_> = m
                    .policies
                    .iter()
                    .map(|p| {
                        json!({
                            "policy": p.policy,
                            "allowed": p.allowed,
                            "denied": p.denied,
                            "fallback": p.fallback,
                            "blocked": p.blocked,
                            "local_admitted": p.local_admitted,
                            "redis_errors": p.redis_errors,
                            "shadow_denied": p.shadow_denied,
                            "near_limit": p.near_limit,
                        })
                    })
                    .collect();
                json!({
                    "policies": policies,
                    "redis_latency": {
                        "buckets_us": shardlimit::metrics::LATENCY_BUCKETS_US,
                        "counts": m.redis_latency.buckets,
                        "sum_us": m.redis_latency.sum_us,
                        "count": m.redis_latency.count,
                    },
                    "events_dropped": m.events_dropped,
                })
            }
            INFO_STATE => json!({
                "is_redis": l.is_redis(),
                "memory_keys": l.memory_keys(),
                "config_generation": l.config_generation(),
                "scale": l.scale(),
                "policies": l.config().policies.keys().cloned().collect::<Vec<_>>(),
            }),
            _ => return Err(invalid("what", "unknown").into()),
        };
        jstr(env, v.to_string())
    })
}

fn report_json(r: shardlimit::ReloadReport) -> Value {
    json!({
        "engine_changed": r.engine_changed,
        "handoff": r.handoff,
        "policies_added": r.policies_added,
        "policies_removed": r.policies_removed,
        "policies_changed": r.policies_changed,
    })
}

/// Reloads from JSON text (`file` false) or a file; answers the report as JSON.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_reload(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    arg: JByteArray,
    file: jboolean,
) -> jstring {
    run(&mut env, std::ptr::null_mut(), |env| {
        let l = limiter(h)?;
        let arg = text(env, &arg, if file != 0 { "path" } else { "config" })?;
        let report = if file != 0 {
            l.reload_from_file(&arg)?
        } else {
            l.reload(shardlimit::Config::from_json(&arg)?)?
        };
        jstr(env, report_json(report).to_string())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_watchConfig(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    path: JByteArray,
    every_us: jlong,
) -> jlong {
    run(&mut env, 0, |env| {
        let l = limiter(h)?;
        let path = text(env, &path, "path")?;
        let every = match every_us {
            1_000..=3_600_000_000 => Duration::from_micros(every_us as u64),
            _ => return Err(invalid("every", "must be 1 ms to 1 hour").into()),
        };
        Ok(Box::into_raw(Box::new(l.watch_config(path, every))) as jlong)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_unwatch(_: JNIEnv, _: JClass, w: jlong) {
    if w != 0 {
        // SAFETY: a handle from `watchConfig`, freed once by the Java watcher's close.
        let w = unsafe { Box::from_raw(w as *mut shardlimit::ConfigWatcher) };
        let _ = std::thread::Builder::new()
            .name("shardlimit-unwatch".into())
            .spawn(move || drop(w));
    }
}

/// The core's latency hook, which observe_health feeds: full limits while the latency
/// (seconds) is at or under `target_us`, `target / latency` above it, never below `min_factor`.
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_latencyScale(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    target_us: jlong,
    min_factor: jdouble,
) {
    run(&mut env, (), |_| {
        let l = limiter(h)?;
        let target =
            opt_us("target", target_us)?.ok_or_else(|| invalid("target", "must not be null"))?;
        l.set_scale_hook(shardlimit::latency_scale(target, min_factor));
        Ok(())
    })
}

/// set_scale (policies: null for all) or, with `observe`, observe_health(factor).
#[no_mangle]
pub extern "system" fn Java_io_shardlimit_Native_scale(
    mut env: JNIEnv,
    _: JClass,
    h: jlong,
    factor: jdouble,
    policies: JObjectArray,
    observe: jboolean,
) -> jdouble {
    run(&mut env, 0.0, |env| {
        let l = limiter(h)?;
        if observe != 0 {
            return Ok(l.observe_health(factor)?);
        }
        let mut names = Vec::new();
        if !policies.as_raw().is_null() {
            for i in 0..env.get_array_length(&policies)? {
                let p = JByteArray::from(env.get_object_array_element(&policies, i)?);
                names.push(text(env, &p, "policies")?);
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        l.set_scale(factor, &names)?;
        Ok(l.scale())
    })
}
