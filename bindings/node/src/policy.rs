//! Policies and ad-hoc limits as JS objects.

use super::*;

/// An ad-hoc limit, validated once: a policy object of the config format
/// (`{ algorithm, limit, window, ... }`) under a name of the caller's choosing (headers,
/// bodies, metrics and Redis keys show it), or the limit's parameters when unnamed.
#[napi]
pub struct NativeLimit {
    pub(crate) policy: shardlimit::Policy,
}

#[napi]
impl NativeLimit {
    #[napi(constructor, catch_unwind)]
    pub fn new(env: Env, spec_json: String, name: Option<String>) -> Result<Self> {
        guarded(|| {
            let v = shardlimit::config::parse_strict_json(&spec_json)?;
            let slot = name.clone().unwrap_or_else(|| "adhoc".to_string());
            let prefix = format!("policies.{slot}");
            let cfg = shardlimit::Config::from_value(
                &serde_json::json!({ "policies": { slot.clone(): v } }),
            )
            .map_err(|e| match e {
                shardlimit::Error::Config { field, message } => shardlimit::Error::Config {
                    field: if name.is_some() && field == prefix {
                        "limit.name".into()
                    } else {
                        field.replacen(&prefix, "limit", 1)
                    },
                    message,
                },
                other => other,
            })?;
            let p = cfg
                .policies
                .get(&slot)
                .cloned()
                .ok_or_else(|| shardlimit::Error::Internal("ad-hoc policy lost".into()))?;
            match name {
                Some(_) => Ok(p),
                None => Ok(shardlimit::Policy::from_limits(p.limits())?
                    .with_on_error(p.on_error())
                    .with_window_offset(p.window_offset())?),
            }
        })
        .map(|policy| NativeLimit { policy })
        .map_err(|e| core_error(&env, e))
    }

    /// The policy name decisions carry.
    #[napi(getter)]
    pub fn name(&self) -> String {
        self.policy.name().to_string()
    }

    /// The limit as an object (`PolicyInfo`).
    #[napi(catch_unwind, ts_return_type = "PolicyInfo")]
    pub fn info(&self) -> serde_json::Value {
        policy_json(&self.policy)
    }
}

pub(crate) fn policy_json(p: &shardlimit::Policy) -> serde_json::Value {
    let mut v = limit_json(p.limit());
    v["name"] = p.name().into();
    v["max"] = p.max().into();
    v["onError"] = p.on_error().name().into();
    if p.is_multi() {
        // every limit of a multi-limit policy: `{ algorithm, params }`
        v["limits"] = p.limits().iter().map(limit_json).collect();
    }
    v
}

/// `{ algorithm, params }` of one limit.
pub(crate) fn limit_json(l: &shardlimit::Limit) -> serde_json::Value {
    use shardlimit::Limit;
    let params = match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            serde_json::json!({ "limit": limit, "windowMs": ms(*window) })
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => serde_json::json!({ "capacity": capacity, "refillPerSec": refill_per_sec }),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => serde_json::json!({ "capacity": capacity, "leakPerSec": leak_per_sec }),
        Limit::Concurrency { max, lease_ttl } => {
            serde_json::json!({ "max": max, "leaseTtlMs": ms(*lease_ttl) })
        }
    };
    serde_json::json!({
        "algorithm": l.algorithm().name(),
        "params": params,
    })
}

#[napi]
impl NativeLimiter {
    /// The config's policy `policy` as plan `plan` has it (`PolicyInfo`).
    #[napi(catch_unwind, ts_return_type = "PolicyInfo")]
    pub fn plan_policy_info(
        &self,
        env: Env,
        plan: String,
        policy: String,
    ) -> Result<serde_json::Value> {
        guarded(|| self.inner.plan_policy(&plan, &policy))
            .map(|p| policy_json(&p))
            .map_err(|e| core_error(&env, e))
    }
}
