//! A decision as JS sees it: an instance of `index.js`'s `Decision` class, whose fields are
//! own data properties (so `structuredClone`, `JSON.stringify`, spreading and
//! `Object.keys` see them, and reading one is a property load, not a call into the
//! addon). The addon makes it with one call of that class's constructor, registered per
//! environment by `setDecisionClass`, with the fields as arguments; `headers()` and
//! `body()` hand the fields back to the core (`decisionHeaders`, `decisionBody`), which
//! renders them. Every duration is whole microseconds in the core (Redis `TIME`, the
//! `Clock`), so milliseconds with three decimals carry it exactly.

use super::*;

/// A core decision on its way to JS (see the module docs).
pub struct Decision {
    pub(crate) inner: shardlimit::Decision,
}

/// The order of `source` indexes, as `index.js`'s `SOURCES` has them.
const SOURCES: [shardlimit::Source; 6] = [
    shardlimit::Source::Redis,
    shardlimit::Source::Memory,
    shardlimit::Source::Local,
    shardlimit::Source::Fallback,
    shardlimit::Source::Block,
    shardlimit::Source::LocalFallback,
];

/// Registers the `Decision` class of this environment. Called once by `index.js`.
#[napi(catch_unwind)]
pub fn set_decision_class(env: Env, ctor: Unknown<'_>) -> Result<()> {
    let mut r = std::ptr::null_mut();
    // SAFETY: JS thread, its env; the reference lives as long as the environment.
    unsafe { check_status!(sys::napi_create_reference(env.raw(), ctor.raw(), 1, &mut r))? };
    let data = env_data_or_init(&env)?;
    if let Some(old) = data.decision_class.replace(r) {
        // SAFETY: a reference this function made, no longer used
        unsafe { sys::napi_delete_reference(env.raw(), old) };
    }
    Ok(())
}

unsafe fn double(env: sys::napi_env, v: f64) -> Result<sys::napi_value> {
    let mut out = std::ptr::null_mut();
    check_status!(sys::napi_create_double(env, v, &mut out))?;
    Ok(out)
}

unsafe fn boolean(env: sys::napi_env, v: bool) -> Result<sys::napi_value> {
    let mut out = std::ptr::null_mut();
    check_status!(sys::napi_get_boolean(env, v, &mut out))?;
    Ok(out)
}

unsafe fn null(env: sys::napi_env) -> Result<sys::napi_value> {
    let mut out = std::ptr::null_mut();
    check_status!(sys::napi_get_null(env, &mut out))?;
    Ok(out)
}

unsafe fn index(env: sys::napi_env, v: Option<u32>) -> Result<sys::napi_value> {
    match v {
        Some(v) => {
            let mut out = std::ptr::null_mut();
            check_status!(sys::napi_create_uint32(env, v, &mut out))?;
            Ok(out)
        }
        None => null(env),
    }
}

impl ToNapiValue for Decision {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        let d = val.inner;
        let class = Env::from_raw(env)
            .get_instance_data::<EnvData>()
            .ok()
            .flatten()
            .and_then(|data| data.decision_class)
            .ok_or_else(|| {
                Error::from_reason(
                    "shardlimit: no Decision class (load the addon through index.js)",
                )
            })?;
        let mut ctor = std::ptr::null_mut();
        check_status!(sys::napi_get_reference_value(env, class, &mut ctor))?;
        let mut policy = std::ptr::null_mut();
        check_status!(sys::napi_create_string_utf8(
            env,
            d.policy.as_ptr().cast(),
            d.policy.len() as isize,
            &mut policy
        ))?;
        let source = SOURCES.iter().position(|s| *s == d.source).unwrap_or(0) as u32;
        let quotas = if d.quotas.is_empty() {
            null(env)?
        } else {
            let q: serde_json::Value = d
                .quotas
                .iter()
                .map(|q| serde_json::json!({ "limit": q.limit, "windowMs": ms(q.window) }))
                .collect();
            serde_json::Value::to_napi_value(env, q)?
        };
        let args = [
            boolean(env, d.allowed)?,
            double(env, d.limit as f64)?,
            double(env, d.remaining as f64)?,
            double(env, ms(d.reset_after))?,
            match d.retry_after {
                Some(r) => double(env, ms(r))?,
                None => null(env)?,
            },
            double(env, ms(d.delay))?,
            policy,
            index(env, Some(source))?,
            index(env, d.shard)?,
            index(env, d.layer.map(|l| l as u32))?,
            boolean(env, d.shadow_denied)?,
            index(env, d.limit_index.map(|l| l as u32))?,
            quotas,
            double(env, ms(d.window))?,
        ];
        let mut out = std::ptr::null_mut();
        check_status!(sys::napi_new_instance(
            env,
            ctor,
            args.len(),
            args.as_ptr(),
            &mut out
        ))?;
        Ok(out)
    }
}

/// One limit of a multi-limit decision, as `Decision.quotas` lists it.
#[napi(object)]
pub struct QuotaFields {
    pub limit: f64,
    pub window_ms: f64,
}

fn micros(ms: f64) -> Duration {
    Duration::from_micros((ms * 1000.0).round().max(0.0) as u64)
}

/// The fields of a JS `Decision` that its headers and body depend on, read from the
/// instance itself (`headers()` passes `this`) by name; `windowMs` is passed beside it
/// (the class keeps it under a symbol).
#[napi(object)]
pub struct DecisionFields {
    pub allowed: bool,
    pub limit: f64,
    pub remaining: f64,
    pub reset_after: f64,
    /// null when not denied (an object field's `Option` takes `undefined`, not null)
    pub retry_after: Either<f64, Null>,
    pub policy: String,
    pub source: String,
    pub shadow_denied: bool,
    pub limit_index: Either<u32, Null>,
    /// a multi-limit decision's limits (empty otherwise)
    pub quotas: Option<Vec<QuotaFields>>,
}

/// The core decision of a JS `Decision`'s fields (what `to_napi_value` gave it).
fn rebuild(f: DecisionFields, window_ms: f64) -> shardlimit::Decision {
    let limit_index = match f.limit_index {
        Either::A(i) => Some(i as usize),
        Either::B(Null) => None,
    };
    shardlimit::Decision {
        allowed: f.allowed,
        limit: f.limit as u64,
        remaining: f.remaining as u64,
        reset_after: micros(f.reset_after),
        retry_after: match f.retry_after {
            Either::A(r) => Some(micros(r)),
            Either::B(Null) => None,
        },
        delay: Duration::ZERO,
        policy: f.policy.into(),
        source: SOURCES
            .into_iter()
            .find(|s| s.name() == f.source)
            .unwrap_or(shardlimit::Source::Redis),
        shard: None,
        window: micros(window_ms),
        layer: None,
        shadow_denied: f.shadow_denied,
        limit_index,
        quotas: match limit_index {
            // a single-limit decision's `quotas` is [] in JS; the core lists none
            None => Vec::new(),
            Some(_) => f
                .quotas
                .unwrap_or_default()
                .into_iter()
                .map(|q| shardlimit::Quota {
                    limit: q.limit as u64,
                    window: micros(q.window_ms),
                })
                .collect(),
        },
        layers: Vec::new(),
    }
}

/// The core's headers of a decision (`Decision.prototype.headers`).
#[napi(catch_unwind, ts_return_type = "Record<string, string>")]
pub fn decision_headers(
    env: Env,
    decision: DecisionFields,
    window_ms: f64,
) -> Result<Object<'static>> {
    let d = rebuild(decision, window_ms);
    let mut obj = Object::new(&env)?;
    for (name, value) in d.headers() {
        obj.set(name, value)?;
    }
    Ok(obj)
}

/// The core's 429 body of a decision (`Decision.prototype.body`).
#[napi(catch_unwind, ts_return_type = "RateLimitBody")]
pub fn decision_body(decision: DecisionFields, window_ms: f64) -> serde_json::Value {
    rebuild(decision, window_ms).body()
}
