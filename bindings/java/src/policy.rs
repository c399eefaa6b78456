//! Limits and policies as JSON for the Java side.

use super::*;

fn limit_json(l: &shardlimit::Limit) -> Value {
    use shardlimit::Limit;
    let params = match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            json!({ "limit": limit, "window_ms": ms(*window) })
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => json!({ "capacity": capacity, "refill_per_sec": refill_per_sec }),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => json!({ "capacity": capacity, "leak_per_sec": leak_per_sec }),
        Limit::Concurrency { max, lease_ttl } => {
            json!({ "max": max, "lease_ttl_ms": ms(*lease_ttl) })
        }
    };
    json!({ "algorithm": l.algorithm().name(), "params": params })
}

pub(crate) fn policy_json(p: &shardlimit::Policy) -> Value {
    let mut v = limit_json(p.limit());
    v["name"] = p.name().into();
    v["max"] = p.max().into();
    v["on_error"] = p.on_error().name().into();
    if p.is_multi() {
        v["limits"] = p.limits().iter().map(limit_json).collect();
    }
    v
}
