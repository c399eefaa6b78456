//! A policy's `shadow` and `near_limit` fields.

use crate::error::{Error, Result};
use crate::policy::{validate_near_limit, Policy};
use serde_json::{Map, Value};

/// `"shadow": true|false` (default false) and `"near_limit": 0.8 | null | false`
/// (default 0.8; null or false turn near-limit events off).
pub(super) fn fields(obj: &Map<String, Value>, field: &str, mut policy: Policy) -> Result<Policy> {
    if let Some(v) = obj.get("shadow") {
        let on = v.as_bool().ok_or_else(|| {
            Error::config(
                format!("{field}.shadow"),
                format!("expected true or false, got {v}"),
            )
        })?;
        if on {
            policy = policy
                .with_shadow(true)
                .map_err(|e| Error::config(format!("{field}.shadow"), strip(&e)))?;
        }
    }
    if let Some(v) = obj.get("near_limit") {
        let f = format!("{field}.near_limit");
        let fraction = match v {
            Value::Null | Value::Bool(false) => None,
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                validate_near_limit(&f, x)?;
                Some(x)
            }
            other => {
                return Err(Error::config(
                    f,
                    format!("expected a fraction > 0 and <= 1, null or false, got {other}"),
                ))
            }
        };
        policy = policy.with_near_limit(fraction)?;
    }
    Ok(policy)
}

/// The message of an error without its field (the config error names the field itself).
fn strip(e: &Error) -> String {
    match e {
        Error::InvalidArgument { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
