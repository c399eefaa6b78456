//! What the value of an override means: the one place where the value a user gives (a rate
//! string, a limit object in JSON, an array of them, or a plan name) becomes limits, and
//! the JSON an override's limits are stored and shown as.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::policy::{Algorithm, Limit, Policy};
use crate::time::duration::duration_from_json;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The value a user gives, resolved against the config: the one place where rate strings
/// and plan names are turned into limits. Accepted: a rate string of one limit or several
/// (`"100/minute"`, `"10/second; 1000/day"`, in the policy's algorithm), a limit object in
/// JSON as in a config policy (`{"algorithm": "token_bucket", "capacity": 100,
/// "refill_per_sec": 10}`, the algorithm defaulting to the policy's, or `{"rate":
/// "100/minute"}`), a JSON array of such objects (several limits), or a plan name (the
/// limits that plan gives the policy). The result replaces the key's whole limit set.
pub fn resolve_override(config: &Config, policy: &Policy, value: &str) -> Result<Vec<Limit>> {
    let text = value.trim();
    if text.is_empty() {
        return Err(Error::invalid(
            "limit",
            "is empty; expected a rate string (\"100/minute\"), a limit object in JSON or a plan name",
        ));
    }
    if text.starts_with('{') || text.starts_with('[') {
        // strict like a config file: a repeated field is an error, never last-wins
        let v = crate::config::parse_strict_json(text).map_err(|e| match e {
            Error::Config { message, .. } => {
                Error::invalid("limit", format!("is not valid JSON: {message}"))
            }
            other => other,
        })?;
        return limits_from_json("limit", &v, policy.algorithm());
    }
    if text.contains('/') || text.to_ascii_lowercase().contains(" per ") {
        return rate_limits("limit", text, policy.algorithm());
    }
    // a plan name: the limit that plan gives this policy
    if !config.plans.contains_key(text) {
        return Err(Error::invalid(
            "limit",
            format!(
                "{text:?} is neither a rate string, a limit object in JSON nor a plan of the config"
            ),
        ));
    }
    let in_plan = config
        .plan_policy(text, policy.name())
        .map_err(|e| Error::invalid("limit", e.to_string()))?;
    Ok(in_plan.limits())
}

/// One limit object, or a JSON array of 1 to 16 of them (several limits checked together).
pub(crate) fn limits_from_json(field: &str, v: &Value, default: Algorithm) -> Result<Vec<Limit>> {
    let Some(items) = v.as_array() else {
        return Ok(vec![limit_from_json(field, v, default)?]);
    };
    if items.is_empty() || items.len() > crate::policy::MAX_LIMITS {
        return Err(Error::invalid(
            field,
            format!(
                "an array of 1 to {} limit objects, got {}",
                crate::policy::MAX_LIMITS,
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| limit_from_json(&format!("{field}[{i}]"), item, default))
        .collect()
}

/// The limits of a rate string (`"100/hour; 1000/day"`), in `algorithm`.
fn rate_limits(field: &str, text: &str, algorithm: Algorithm) -> Result<Vec<Limit>> {
    if algorithm == Algorithm::Concurrency {
        return Err(Error::invalid(
            field,
            "a concurrency policy's override is a limit object {\"max\": N, \"lease_ttl\": \"30s\"}, not a rate",
        ));
    }
    crate::rate::parse_rate_as(text, algorithm).map_err(|e| Error::invalid(field, e.to_string()))
}

fn single_rate(field: &str, text: &str, algorithm: Algorithm) -> Result<Limit> {
    let algorithm = if algorithm == Algorithm::Concurrency {
        return Err(Error::invalid(
            field,
            "a concurrency policy's override is a limit object {\"max\": N, \"lease_ttl\": \"30s\"}, not a rate",
        ));
    } else {
        algorithm
    };
    let mut limits = crate::rate::parse_rate_as(text, algorithm)
        .map_err(|e| Error::invalid(field, e.to_string()))?;
    if limits.len() != 1 {
        return Err(Error::invalid(
            field,
            format!(
                "{text:?} holds {} limits; a limit object holds one (give several as a rate string or a JSON array of limit objects)",
                limits.len()
            ),
        ));
    }
    Ok(limits.remove(0))
}

fn u64_field(field: &str, name: &str, o: &Map<String, Value>) -> Result<u64> {
    match o.get(name) {
        Some(v) => v.as_u64().ok_or_else(|| {
            Error::invalid(
                format!("{field}.{name}"),
                format!("expected a positive integer, got {v}"),
            )
        }),
        None => Err(Error::invalid(format!("{field}.{name}"), "is required")),
    }
}

fn f64_field(field: &str, name: &str, o: &Map<String, Value>) -> Result<f64> {
    match o.get(name) {
        Some(v) => v.as_f64().ok_or_else(|| {
            Error::invalid(
                format!("{field}.{name}"),
                format!("expected a positive number, got {v}"),
            )
        }),
        None => Err(Error::invalid(format!("{field}.{name}"), "is required")),
    }
}

fn dur_field(field: &str, name: &str, o: &Map<String, Value>) -> Result<Duration> {
    match o.get(name) {
        Some(v) => duration_from_json(&format!("{field}.{name}"), v)
            .map(Duration::from_micros)
            .map_err(|e| Error::invalid(format!("{field}.{name}"), e.to_string())),
        None => Err(Error::invalid(format!("{field}.{name}"), "is required")),
    }
}

/// A limit object (the fields of a config policy's limit; `algorithm` defaults to
/// `default`). Unknown fields are errors naming them.
pub(crate) fn limit_from_json(field: &str, v: &Value, default: Algorithm) -> Result<Limit> {
    let o = v.as_object().ok_or_else(|| {
        Error::invalid(
            field,
            format!("expected a limit object or a rate string, got {v}"),
        )
    })?;
    let algorithm = match o.get("algorithm") {
        None => default,
        Some(a) => a.as_str().and_then(Algorithm::from_name).ok_or_else(|| {
            Error::invalid(
                format!("{field}.algorithm"),
                format!(
                    "unknown algorithm {a}; expected one of: {}",
                    Algorithm::ALL
                        .iter()
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?,
    };
    let (limit, params): (Limit, &[&str]) = if let Some(r) = o.get("rate") {
        let text = r.as_str().ok_or_else(|| {
            Error::invalid(
                format!("{field}.rate"),
                format!("expected a rate string, got {r}"),
            )
        })?;
        (
            single_rate(&format!("{field}.rate"), text, algorithm)?,
            &["rate"],
        )
    } else {
        match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
                let (limit, window) = (
                    u64_field(field, "limit", o)?,
                    dur_field(field, "window", o)?,
                );
                let l = match algorithm {
                    Algorithm::FixedWindow => Limit::fixed_window(limit, window),
                    Algorithm::SlidingWindow => Limit::sliding_window(limit, window),
                    _ => Limit::sliding_log(limit, window),
                };
                (l, &["limit", "window"])
            }
            Algorithm::TokenBucket => (
                Limit::token_bucket(
                    u64_field(field, "capacity", o)?,
                    f64_field(field, "refill_per_sec", o)?,
                ),
                &["capacity", "refill_per_sec"],
            ),
            Algorithm::LeakyBucket => (
                Limit::leaky_bucket(
                    u64_field(field, "capacity", o)?,
                    f64_field(field, "leak_per_sec", o)?,
                ),
                &["capacity", "leak_per_sec"],
            ),
            Algorithm::Concurrency => (
                Limit::concurrency(
                    u64_field(field, "max", o)?,
                    dur_field(field, "lease_ttl", o)?,
                ),
                &["max", "lease_ttl"],
            ),
        }
    };
    if let Some(k) = o
        .keys()
        .find(|k| k.as_str() != "algorithm" && !params.contains(&k.as_str()))
    {
        return Err(Error::invalid(
            format!("{field}.{k}"),
            format!(
                "unknown field for a {algorithm} override; expected: algorithm, {}",
                params.join(", ")
            ),
        ));
    }
    Ok(limit)
}

/// The canonical JSON of a limit, as stored (read back by [`limit_from_json`]).
pub(crate) fn limit_to_json(l: &Limit) -> Value {
    let ms = |d: &Duration| format!("{}ms", d.as_millis());
    let a = l.algorithm().name();
    match l {
        Limit::FixedWindow { limit, window }
        | Limit::SlidingWindow { limit, window }
        | Limit::SlidingLog { limit, window } => {
            json!({"algorithm": a, "limit": limit, "window": ms(window)})
        }
        Limit::TokenBucket {
            capacity,
            refill_per_sec,
        } => json!({"algorithm": a, "capacity": capacity, "refill_per_sec": refill_per_sec}),
        Limit::LeakyBucket {
            capacity,
            leak_per_sec,
        } => json!({"algorithm": a, "capacity": capacity, "leak_per_sec": leak_per_sec}),
        Limit::Concurrency { max, lease_ttl } => {
            json!({"algorithm": a, "max": max, "lease_ttl": ms(lease_ttl)})
        }
    }
}

/// The canonical JSON of an override's limits, as stored: one limit object, or an array
/// of them (read back by [`limits_from_json`]).
pub(super) fn limits_to_json(limits: &[Limit]) -> Value {
    match limits {
        [one] => limit_to_json(one),
        all => Value::Array(all.iter().map(limit_to_json).collect()),
    }
}
