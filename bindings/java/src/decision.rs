//! Decisions both ways: a core decision as an `io.shardlimit.Decision`, and one rebuilt
//! from a Java decision's fields to render the core's headers and 429 body.

use super::*;

const DECISION_SIG: &str = "(ZJJJJJLjava/lang/String;IIIZI[JJ)V";

const SOURCES: [Source; 6] = [
    Source::Redis,
    Source::Memory,
    Source::Local,
    Source::Fallback,
    Source::Block,
    Source::LocalFallback,
];

fn us(d: Duration) -> jlong {
    d.as_micros().min(i64::MAX as u128) as jlong
}

fn opt_index(v: Option<u32>) -> jint {
    v.map(|v| v.min(i32::MAX as u32) as jint).unwrap_or(-1)
}

/// A core decision as an `io.shardlimit.Decision`.
pub(crate) fn decision<'l>(env: &mut JNIEnv<'l>, d: Decision) -> jni::errors::Result<JObject<'l>> {
    let g = GLOBALS
        .get()
        .ok_or(jni::errors::Error::NullPtr("shardlimit: not loaded"))?;
    let policy = env.new_string(&*d.policy)?;
    let quotas: JObject = if d.quotas.is_empty() {
        JObject::null()
    } else {
        let flat: Vec<jlong> = d
            .quotas
            .iter()
            .flat_map(|q| [q.limit as jlong, us(q.window)])
            .collect();
        let arr = env.new_long_array(flat.len() as i32)?;
        env.set_long_array_region(&arr, 0, &flat)?;
        arr.into()
    };
    let source = SOURCES.iter().position(|s| *s == d.source).unwrap_or(0) as jint;
    env.new_object(
        class(&g.decision),
        DECISION_SIG,
        &[
            JValue::Bool(d.allowed as jboolean),
            JValue::Long(d.limit.min(i64::MAX as u64) as jlong),
            JValue::Long(d.remaining.min(i64::MAX as u64) as jlong),
            JValue::Long(us(d.reset_after)),
            JValue::Long(d.retry_after.map(us).unwrap_or(-1)),
            JValue::Long(us(d.delay)),
            JValue::Object(&policy),
            JValue::Int(source),
            JValue::Int(opt_index(d.shard)),
            JValue::Int(opt_index(d.layer.map(|l| l as u32))),
            JValue::Bool(d.shadow_denied as jboolean),
            JValue::Int(opt_index(d.limit_index.map(|l| l as u32))),
            JValue::Object(&quotas),
            JValue::Long(us(d.window)),
        ],
    )
}

fn micros(us: jlong) -> Duration {
    Duration::from_micros(us.max(0) as u64)
}

/// The core decision of a Java `Decision`'s fields (what `decision` gave it).
#[allow(clippy::too_many_arguments)]
fn rebuild(
    env: &JNIEnv,
    allowed: jboolean,
    limit: jlong,
    remaining: jlong,
    reset_after_us: jlong,
    retry_after_us: jlong,
    policy: String,
    source: jint,
    shadow_denied: jboolean,
    limit_index: jint,
    quotas: &JLongArray,
    window_us: jlong,
) -> Result<Decision, Fail> {
    let mut q = Vec::new();
    if !quotas.as_raw().is_null() {
        let n = env.get_array_length(quotas)?;
        let mut flat = vec![0; n as usize];
        env.get_long_array_region(quotas, 0, &mut flat)?;
        q = flat
            .chunks_exact(2)
            .map(|c| shardlimit::Quota {
                limit: c[0].max(0) as u64,
                window: micros(c[1]),
            })
            .collect();
    }
    Ok(Decision {
        allowed: allowed != 0,
        limit: limit.max(0) as u64,
        remaining: remaining.max(0) as u64,
        reset_after: micros(reset_after_us),
        retry_after: (retry_after_us >= 0).then(|| micros(retry_after_us)),
        delay: Duration::ZERO,
        policy: policy.into(),
        source: SOURCES
            .get(source as usize)
            .copied()
            .unwrap_or(Source::Redis),
        shard: None,
        window: micros(window_us),
        layer: None,
        shadow_denied: shadow_denied != 0,
        limit_index: (limit_index >= 0).then_some(limit_index as usize),
        layers: Vec::new(),
        quotas: if limit_index >= 0 { q } else { Vec::new() },
    })
}

/// The core's headers (as name, value, name, value...) or, with `body`, its 429 body
/// (one JSON text) of a decision's fields.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_shardlimit_Native_render(
    mut env: JNIEnv,
    _: JClass,
    allowed: jboolean,
    limit: jlong,
    remaining: jlong,
    reset_after_us: jlong,
    retry_after_us: jlong,
    policy: JString,
    source: jint,
    shadow_denied: jboolean,
    limit_index: jint,
    quotas: JLongArray,
    window_us: jlong,
    body: jboolean,
) -> jobject {
    run(&mut env, std::ptr::null_mut(), |env| {
        let policy: String = env.get_string(&policy)?.into();
        let d = rebuild(
            env,
            allowed,
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
            policy,
            source,
            shadow_denied,
            limit_index,
            &quotas,
            window_us,
        )?;
        let g = globals()?;
        let parts: Vec<String> = if body != 0 {
            vec![d.body().to_string()]
        } else {
            d.headers()
                .into_iter()
                .flat_map(|(k, v)| [k.to_string(), v])
                .collect()
        };
        let arr = env.new_object_array(parts.len() as i32, class(&g.string), JObject::null())?;
        for (i, p) in parts.iter().enumerate() {
            let s = env.new_string(p)?;
            env.set_object_array_element(&arr, i as i32, &s)?;
            env.delete_local_ref(s)?;
        }
        Ok(arr.into_raw())
    })
}
