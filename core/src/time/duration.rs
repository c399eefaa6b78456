//! Durations in configs: `"500ms"`, `"1s"`, `"1m"`, `"1h"`, `"1d"`, `"1.5s"` or an integer
//! number of milliseconds.

use crate::error::{Error, Result};
use serde_json::Value;

/// Microseconds in one millisecond, second, minute, hour and day.
const UNITS: &[(&str, u64)] = &[
    ("us", 1),
    ("ms", 1_000),
    ("s", 1_000_000),
    ("m", 60_000_000),
    ("h", 3_600_000_000),
    ("d", 86_400_000_000),
];

/// Parses a duration string into microseconds. `field` names the config field in errors.
pub fn parse_duration_us(field: &str, text: &str) -> Result<u64> {
    let bad = || {
        Error::config(
            field,
            format!("expected a duration like \"1m\", \"500ms\" or an integer of milliseconds, got {text:?}"),
        )
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let mult = if unit.is_empty() {
        1_000
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit.trim())
            .map(|(_, m)| *m)
            .ok_or_else(bad)?
    };
    let value: f64 = num.parse().map_err(|_| bad())?;
    let us = value * mult as f64;
    if !us.is_finite() || us >= 9.0e15 {
        return Err(Error::config(
            field,
            format!("duration {text:?} is too long"),
        ));
    }
    Ok(us.round() as u64)
}

/// Parses a JSON value (string or integer milliseconds) as a duration in microseconds.
pub fn duration_from_json(field: &str, v: &Value) -> Result<u64> {
    match v {
        Value::String(s) => parse_duration_us(field, s),
        Value::Number(n) => match n.as_u64() {
            Some(ms) if ms <= 9_000_000_000_000 => Ok(ms * 1_000),
            _ => Err(Error::config(
                field,
                format!("expected a duration like \"1m\" or a non-negative integer of milliseconds, got {n}"),
            )),
        },
        other => Err(Error::config(
            field,
            format!("expected a duration like \"1m\", got {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn parses_units() {
        assert_eq!(parse_duration_us("f", "500ms").unwrap(), 500_000);
        assert_eq!(parse_duration_us("f", "1s").unwrap(), 1_000_000);
        assert_eq!(parse_duration_us("f", "1m").unwrap(), 60_000_000);
        assert_eq!(parse_duration_us("f", "1h").unwrap(), 3_600_000_000);
        assert_eq!(parse_duration_us("f", "1d").unwrap(), 86_400_000_000);
        assert_eq!(parse_duration_us("f", "1.5s").unwrap(), 1_500_000);
        assert_eq!(parse_duration_us("f", "250").unwrap(), 250_000);
    }
    #[test]
    fn rejects_garbage_naming_the_field() {
        let e = parse_duration_us("policies.login.window", "abc").unwrap_err();
        assert_eq!(
            e.to_string(),
            "policies.login.window: expected a duration like \"1m\", \"500ms\" or an integer of milliseconds, got \"abc\""
        );
        assert!(parse_duration_us("f", "1y").is_err());
        assert!(parse_duration_us("f", "-1s").is_err());
        assert!(parse_duration_us("f", "").is_err());
        assert!(parse_duration_us("f", "1e300s").is_err());
    }
}
