//! The policies of a config: each field read and checked, errors naming it.

use super::plans::{limits_of, rate_limits};
use crate::config::check_fields;
use crate::error::{Error, Result};
use crate::policy::{
    validate_auto_block, validate_local, Algorithm, AutoBlock, LocalAdmission, OnError, Policy,
    WindowOffset,
};
use crate::time::duration::duration_from_json;
use serde_json::Value;
use std::time::Duration;

pub(super) fn on_error(field: &str, v: &Value) -> Result<OnError> {
    match v.as_str() {
        Some(s) => OnError::parse(field, s),
        None => Err(Error::config(
            field,
            format!("expected \"open\", \"closed\", \"local\" or \"error\", got {v}"),
        )),
    }
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

pub(super) fn policy(
    name: &str,
    v: &Value,
    default_on_error: OnError,
    default_algorithm: Algorithm,
) -> Result<Policy> {
    policy_at(
        &format!("policies.{name}"),
        name,
        v,
        default_on_error,
        default_algorithm,
    )
}

/// A policy spec at `field`: a rate string (`"5/minute"`, several limits with `;`), or an
/// object with the limit (`algorithm` and its parameters, or `rate`, or `limits`) and the
/// policy's other fields.
pub(super) fn policy_at(
    field: &str,
    name: &str,
    v: &Value,
    default_on_error: OnError,
    default_algorithm: Algorithm,
) -> Result<Policy> {
    let field = field.to_string();
    if let Some(text) = v.as_str() {
        let limits = rate_limits(&field, text, default_algorithm)?;
        return Policy::build_multi(name, limits, default_on_error, &field);
    }
    let obj = v.as_object().ok_or_else(|| {
        Error::config(
            &field,
            format!("expected a rate string like \"5/minute\" or an object, got {v}"),
        )
    })?;
    let f = |k: &str| format!("{field}.{k}");
    let (params, limits) = limits_of(&field, obj, default_algorithm)?;
    let mut known = vec![
        "algorithm",
        "on_error",
        "description",
        "auto_block",
        "local_admission",
        "shadow",
        "near_limit",
        "overrides",
    ];
    known.extend(params);
    known.push("window_offset");
    check_fields(obj, &format!("{field}."), &known)?;
    let on_error = match obj.get("on_error") {
        Some(v) => on_error(&f("on_error"), v)?,
        None => default_on_error,
    };
    let mut policy = Policy::build_multi(name, limits, on_error, &field)?;
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
    if let Some(v) = obj.get("window_offset") {
        policy = policy.with_window_offset(window_offset(&f("window_offset"), v)?)?;
    }
    policy = super::shadow::fields(obj, &field, policy)?;
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

fn window_offset(field: &str, v: &Value) -> Result<WindowOffset> {
    v.as_str()
        .and_then(WindowOffset::from_name)
        .ok_or_else(|| Error::config(field, format!("expected \"none\" or \"per_key\", got {v}")))
}

#[cfg(test)]
mod on_error_tests {
    use super::*;

    #[test]
    fn a_bad_on_error_names_every_accepted_value() {
        for v in [serde_json::json!("fail"), serde_json::json!(3)] {
            let e = on_error("policies.p.on_error", &v).unwrap_err().to_string();
            assert!(e.contains("policies.p.on_error"), "{e}");
            for name in ["\"open\"", "\"closed\"", "\"local\"", "\"error\""] {
                assert!(e.contains(name), "{e} lacks {name}");
            }
        }
        assert_eq!(
            on_error("f", &serde_json::json!("error")).unwrap(),
            OnError::Error
        );
    }
}
