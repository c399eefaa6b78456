//! The policies of a config: each field read and checked, errors naming it.

use super::*;
use crate::error::{Error, Result};
use crate::policy::{
    validate_auto_block, validate_local, Algorithm, AutoBlock, Limit, LocalAdmission, OnError,
    Policy,
};
use crate::time::duration::duration_from_json;
use serde_json::Value;
use std::time::Duration;

pub(super) fn on_error(field: &str, v: &Value) -> Result<OnError> {
    v.as_str().and_then(OnError::from_name).ok_or_else(|| {
        Error::config(
            field,
            format!("expected \"open\", \"closed\" or \"local\", got {v}"),
        )
    })
}

pub(super) fn count(field: String, v: Option<&Value>) -> Result<u64> {
    match v {
        Some(v) => v
            .as_u64()
            .ok_or_else(|| Error::config(&field, format!("expected a positive integer, got {v}"))),
        None => Err(Error::config(field, "is required")),
    }
}

pub(super) fn dur(field: String, v: Option<&Value>) -> Result<Duration> {
    match v {
        Some(v) => duration_from_json(&field, v).map(Duration::from_micros),
        None => Err(Error::config(field, "is required")),
    }
}

pub(super) fn rate(field: String, v: Option<&Value>) -> Result<f64> {
    match v {
        Some(v) => v
            .as_f64()
            .ok_or_else(|| Error::config(&field, format!("expected a positive number, got {v}"))),
        None => Err(Error::config(field, "is required")),
    }
}

pub(super) fn policy(name: &str, v: &Value, default_on_error: OnError) -> Result<Policy> {
    let field = format!("policies.{name}");
    let obj = v
        .as_object()
        .ok_or_else(|| Error::config(&field, format!("expected an object, got {v}")))?;
    let algo_name = obj
        .get("algorithm")
        .ok_or_else(|| Error::config(format!("{field}.algorithm"), "is required"))?;
    let algorithm = algo_name
        .as_str()
        .and_then(Algorithm::from_name)
        .ok_or_else(|| {
            Error::config(
                format!("{field}.algorithm"),
                format!(
                    "unknown algorithm {algo_name}; expected one of: {}",
                    Algorithm::ALL
                        .iter()
                        .map(|a| a.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?;
    let f = |k: &str| format!("{field}.{k}");
    let (params, limit) = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow | Algorithm::SlidingLog => {
            let limit = count(f("limit"), obj.get("limit"))?;
            let window = dur(f("window"), obj.get("window"))?;
            let l = match algorithm {
                Algorithm::FixedWindow => Limit::fixed_window(limit, window),
                Algorithm::SlidingWindow => Limit::sliding_window(limit, window),
                _ => Limit::sliding_log(limit, window),
            };
            (["limit", "window"], l)
        }
        Algorithm::TokenBucket => (
            ["capacity", "refill_per_sec"],
            Limit::token_bucket(
                count(f("capacity"), obj.get("capacity"))?,
                rate(f("refill_per_sec"), obj.get("refill_per_sec"))?,
            ),
        ),
        Algorithm::LeakyBucket => (
            ["capacity", "leak_per_sec"],
            Limit::leaky_bucket(
                count(f("capacity"), obj.get("capacity"))?,
                rate(f("leak_per_sec"), obj.get("leak_per_sec"))?,
            ),
        ),
        Algorithm::Concurrency => (
            ["max", "lease_ttl"],
            Limit::concurrency(
                count(f("max"), obj.get("max"))?,
                dur(f("lease_ttl"), obj.get("lease_ttl"))?,
            ),
        ),
    };
    let mut known = vec![
        "algorithm",
        "on_error",
        "description",
        "auto_block",
        "local_admission",
        "overrides",
    ];
    known.extend(params);
    check_fields(obj, &format!("{field}."), &known)?;
    let on_error = match obj.get("on_error") {
        Some(v) => on_error(&f("on_error"), v)?,
        None => default_on_error,
    };
    let mut policy = Policy::build(name, limit, on_error, &field)?;
    if let Some(v) = obj.get("auto_block") {
        let f = format!("{field}.auto_block");
        let o = v.as_object().ok_or_else(|| {
            Error::config(
                &f,
                format!("expected {{\"after\": N, \"within\": \"1m\", \"for\": \"15m\"}}, got {v}"),
            )
        })?;
        check_fields(o, &format!("{f}."), &["after", "within", "for"])?;
        let a = AutoBlock {
            after: count(format!("{f}.after"), o.get("after"))?,
            within: dur(format!("{f}.within"), o.get("within"))?,
            duration: dur(format!("{f}.for"), o.get("for"))?,
        };
        validate_auto_block(&f, &a)?;
        policy = policy.with_auto_block(a)?;
    }
    if let Some(v) = obj.get("local_admission") {
        let f = format!("{field}.local_admission");
        let o = v.as_object().ok_or_else(|| {
            Error::config(
                &f,
                format!("expected {{\"max_batch\": N, \"max_hold\": \"1s\"}}, got {v}"),
            )
        })?;
        check_fields(o, &format!("{f}."), &["max_batch", "max_hold"])?;
        let l = LocalAdmission {
            max_batch: match o.get("max_batch") {
                Some(_) => count(format!("{f}.max_batch"), o.get("max_batch"))?,
                None => 100,
            },
            max_hold: match o.get("max_hold") {
                Some(_) => dur(format!("{f}.max_hold"), o.get("max_hold"))?,
                None => Duration::from_secs(1),
            },
        };
        validate_local(&f, policy.algorithm(), &l)?;
        policy = policy.with_local_admission(l)?;
    }
    if let Some(v) = obj.get("overrides") {
        let on = v.as_bool().ok_or_else(|| {
            Error::config(f("overrides"), format!("expected true or false, got {v}"))
        })?;
        if on {
            policy = policy.with_overrides()?;
        }
    }
    Ok(policy)
}
