//! The limits of a policy spec (`algorithm` and its parameters, a `rate` string, or a list
//! of `limits`), the config's `default_algorithm`, and `plans`: per tier, replacement limits
//! for named policies.

use super::policies::{count, dur, policy_at, rate};
use crate::config::{check_fields, kind, Config};
use crate::error::{Error, Result};
use crate::policy::{validate_policy_name, Algorithm, Limit, Policy};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The parameter fields of each algorithm, as a policy object names them.
fn params(algorithm: Algorithm) -> &'static [&'static str] {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            &["limit", "window"]
        }
        Algorithm::TokenBucket => &["capacity", "refill_per_sec"],
        Algorithm::LeakyBucket => &["capacity", "leak_per_sec"],
        Algorithm::Concurrency => &["max", "lease_ttl"],
    }
}

fn algorithm_at(field: &str, v: &Value) -> Result<Algorithm> {
    v.as_str().and_then(Algorithm::from_name).ok_or_else(|| {
        Error::config(
            field,
            format!(
                "unknown algorithm {v}; expected one of: {}",
                Algorithm::ALL
                    .iter()
                    .map(|a| a.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// The limits of a rate string at `field`, of `algorithm`; errors name the field and quote
/// the bad part.
pub(super) fn rate_limits(field: &str, text: &str, algorithm: Algorithm) -> Result<Vec<Limit>> {
    crate::rate::parse_rate_as(text, algorithm).map_err(|e| match e {
        Error::InvalidArgument { message, .. } => Error::config(field, message),
        other => other,
    })
}

/// The limits a policy object at `field` holds, and the fields they were read from (for
/// the unknown-field check): `"limits": [...]`, or one limit (`algorithm` with its
/// parameters, or `rate` with an optional `algorithm`, `default_algorithm` otherwise).
pub(super) fn limits_of(
    field: &str,
    obj: &Map<String, Value>,
    default_algorithm: Algorithm,
) -> Result<(Vec<&'static str>, Vec<Limit>)> {
    let Some(list) = obj.get("limits") else {
        return one_limit(field, obj, default_algorithm);
    };
    if let Some(k) = ["algorithm", "rate"]
        .iter()
        .chain(Algorithm::ALL.iter().flat_map(|a| params(*a)))
        .find(|k| obj.contains_key(**k))
    {
        return Err(Error::config(
            format!("{field}.{k}"),
            "give the limits either in `limits` or beside it, not both",
        ));
    }
    let items = list.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
        Error::config(
            format!("{field}.limits"),
            format!("expected a non-empty list of limits (objects or rate strings), got {list}"),
        )
    })?;
    let mut limits = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let f = format!("{field}.limits[{i}]");
        match item {
            Value::String(text) => limits.extend(rate_limits(&f, text, default_algorithm)?),
            Value::Object(o) => {
                let (known, mut ls) = one_limit(&f, o, default_algorithm)?;
                let mut known = known;
                known.push("algorithm");
                check_fields(o, &format!("{f}."), &known)?;
                limits.append(&mut ls);
            }
            other => {
                return Err(Error::config(
                    f,
                    format!("expected a limit object or a rate string, got {other}"),
                ))
            }
        }
    }
    Ok((vec!["limits"], limits))
}

fn one_limit(
    field: &str,
    obj: &Map<String, Value>,
    default_algorithm: Algorithm,
) -> Result<(Vec<&'static str>, Vec<Limit>)> {
    let f = |k: &str| format!("{field}.{k}");
    let algorithm = match obj.get("algorithm") {
        Some(v) => algorithm_at(&f("algorithm"), v)?,
        None if obj.contains_key("rate") => default_algorithm,
        None => {
            return Err(Error::config(
                f("algorithm"),
                "is required (or give a `rate`)",
            ))
        }
    };
    if let Some(r) = obj.get("rate") {
        if let Some(k) = params(algorithm).iter().find(|k| obj.contains_key(**k)) {
            return Err(Error::config(
                f(k),
                "give either `rate` or the algorithm's parameters, not both",
            ));
        }
        let text = r.as_str().ok_or_else(|| {
            Error::config(
                f("rate"),
                format!("expected a rate string like \"100/minute\", got {r}"),
            )
        })?;
        return Ok((vec!["rate"], rate_limits(&f("rate"), text, algorithm)?));
    }
    let limit = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            let limit = count(f("limit"), obj.get("limit"))?;
            let window = dur(f("window"), obj.get("window"))?;
            match algorithm {
                Algorithm::FixedWindow => Limit::fixed_window(limit, window),
                Algorithm::SlidingWindow => Limit::sliding_window(limit, window),
                _ => Limit::sliding_log(limit, window),
            }
        }
        Algorithm::TokenBucket => Limit::token_bucket(
            count(f("capacity"), obj.get("capacity"))?,
            rate(f("refill_per_sec"), obj.get("refill_per_sec"))?,
        ),
        Algorithm::LeakyBucket => Limit::leaky_bucket(
            count(f("capacity"), obj.get("capacity"))?,
            rate(f("leak_per_sec"), obj.get("leak_per_sec"))?,
        ),
        Algorithm::Concurrency => Limit::concurrency(
            count(f("max"), obj.get("max"))?,
            dur(f("lease_ttl"), obj.get("lease_ttl"))?,
        ),
    };
    Ok((params(algorithm).to_vec(), vec![limit]))
}

/// `default_algorithm`: the algorithm of rate strings that name none.
pub(super) fn default_algorithm(v: &Value) -> Result<Algorithm> {
    let a = algorithm_at("default_algorithm", v)?;
    if a == Algorithm::Concurrency {
        return Err(Error::config(
            "default_algorithm",
            "a concurrency limit has no rate; expected fixed_window, sliding_window, sliding_log, token_bucket or leaky_bucket",
        ));
    }
    Ok(a)
}

/// `plans`: `{"free": {"api": "10/second; 1000/day", ...}, ...}`. Each entry replaces the
/// limits of a policy of `policies` under the plan; fields it does not set (`on_error`,
/// `auto_block`, `local_admission`) are the policy's own.
pub(super) fn plans(
    v: &Value,
    policies: &BTreeMap<String, Policy>,
    default_algorithm: Algorithm,
) -> Result<BTreeMap<String, BTreeMap<String, Policy>>> {
    let map = v.as_object().ok_or_else(|| {
        Error::config(
            "plans",
            format!("expected an object of named plans, got {}", kind(v)),
        )
    })?;
    let mut out = BTreeMap::new();
    for (plan, entries) in map {
        let pf = format!("plans.{plan}");
        validate_policy_name(plan, &pf).map_err(|_| {
            Error::config(
                &pf,
                format!("plan name {plan:?} must be 1 to 128 letters, digits, '_', '-' or '.'"),
            )
        })?;
        let entries = entries.as_object().ok_or_else(|| {
            Error::config(
                &pf,
                format!(
                    "expected an object mapping policy names to limits, got {}",
                    kind(entries)
                ),
            )
        })?;
        let mut in_plan = BTreeMap::new();
        for (name, spec) in entries {
            let f = format!("{pf}.{name}");
            let base = policies.get(name).ok_or_else(|| {
                Error::config(
                    &f,
                    format!("no policy named {name:?} in `policies`; a plan can only replace the limits of a configured policy"),
                )
            })?;
            let mut p = policy_at(&f, name, spec, base.on_error(), default_algorithm)?;
            let sets = |k: &str| spec.as_object().is_some_and(|o| o.contains_key(k));
            if let (Some(a), false) = (base.auto_block(), sets("auto_block")) {
                p = p.with_auto_block(a)?;
            }
            if let (Some(l), false) = (base.local_admission(), sets("local_admission")) {
                p = p.with_local_admission(l).map_err(|e| {
                    Error::config(
                        &f,
                        format!("policy {name} uses local_admission, which these limits cannot keep ({e}); give the plan's limits a local_admission of their own or none"),
                    )
                })?;
            }
            in_plan.insert(name.clone(), p);
        }
        out.insert(plan.clone(), in_plan);
    }
    Ok(out)
}

impl Config {
    /// The policy named `policy` as plan `plan` has it: the plan's replacement under the
    /// policy's name, or the policy itself when the plan does not list it. The one place
    /// a (plan, policy) pair is resolved: checks under a plan, and per-key overrides
    /// naming a plan, go through it. Errors: `unknown_policy`; `invalid_argument` (`plan`)
    /// for a plan the config does not define.
    pub fn plan_policy(&self, plan: &str, policy: &str) -> Result<Policy> {
        let base = self
            .policies
            .get(policy)
            .ok_or_else(|| Error::unknown_policy(policy))?;
        let in_plan = self.plans.get(plan).ok_or_else(|| {
            Error::invalid(
                "plan",
                format!(
                    "no plan named {plan:?} in the config (plans: {})",
                    if self.plans.is_empty() {
                        "none".to_string()
                    } else {
                        self.plans.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ),
            )
        })?;
        Ok(in_plan.get(policy).unwrap_or(base).clone())
    }
}
