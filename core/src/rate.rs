//! Rate strings: the `limits` package's syntax (Flask-Limiter, slowapi) for one or more
//! limits in a line of text.
//!
//! ```
//! use shardlimit::{parse_rate, Limit};
//! use std::time::Duration;
//!
//! assert_eq!(
//!     parse_rate("100/hour; 1000/day").unwrap(),
//!     vec![
//!         Limit::fixed_window(100, Duration::from_secs(3_600)),
//!         Limit::fixed_window(1_000, Duration::from_secs(86_400)),
//!     ]
//! );
//! ```
//!
//! Grammar: one or more items separated by `;`, `,` or `|`; an item is
//! `COUNT ("/" | "per") [MULTIPLE] UNIT`, with spaces allowed around each part and the
//! unit in any case, singular or plural: `second`, `minute`, `hour`, `day`, `month`
//! (30 days) or `year` (360 days, as in `limits`; the core's longest window is 366 days).
//! `"5/minute"`, `"10 per second"`, `"3/5 minutes"`. Errors are invalid-argument errors
//! whose message quotes the bad part.

use crate::error::{Error, Result};
use crate::policy::{Algorithm, Limit};
use std::time::Duration;

/// Seconds in each unit a rate string may name.
const UNITS: &[(&str, u64)] = &[
    ("second", 1),
    ("minute", 60),
    ("hour", 3_600),
    ("day", 86_400),
    ("month", 30 * 86_400),
    ("year", 360 * 86_400),
];

/// Parses a rate string into fixed-window limits, in the order written.
pub fn parse_rate(text: &str) -> Result<Vec<Limit>> {
    parse_rate_as(text, Algorithm::FixedWindow)
}

/// Parses a rate string into limits of `algorithm`: for the windowed algorithms and the
/// sliding log, `COUNT` per window; for the token and leaky buckets, a capacity of `COUNT`
/// refilled (drained) at `COUNT` per window. A concurrency limit has no rate: an error.
/// The limits are not validated here (a policy built from them is).
pub fn parse_rate_as(text: &str, algorithm: Algorithm) -> Result<Vec<Limit>> {
    if algorithm == Algorithm::Concurrency {
        return Err(Error::invalid(
            "rate",
            "a concurrency limit has no rate; build it with a maximum and a lease TTL",
        ));
    }
    if text.trim().is_empty() {
        return Err(Error::invalid(
            "rate",
            "is empty; expected a rate like \"5/minute\" or \"100/hour; 1000/day\"",
        ));
    }
    text.split([';', ',', '|'])
        .map(|item| {
            let (count, secs) = parse_item(item, text)?;
            Ok(limit_of(algorithm, count, secs))
        })
        .collect()
}

fn limit_of(algorithm: Algorithm, count: u64, secs: u64) -> Limit {
    let window = Duration::from_secs(secs);
    let per_sec = count as f64 / secs as f64;
    match algorithm {
        Algorithm::FixedWindow => Limit::fixed_window(count, window),
        Algorithm::SlidingWindow => Limit::sliding_window(count, window),
        Algorithm::SlidingLog => Limit::sliding_log(count, window),
        Algorithm::TokenBucket => Limit::token_bucket(count, per_sec),
        Algorithm::LeakyBucket => Limit::leaky_bucket(count, per_sec),
        Algorithm::Concurrency => unreachable!("refused by parse_rate_as"),
    }
}

/// One `COUNT / [MULTIPLE] UNIT` item: (count, window in seconds).
fn parse_item(item: &str, whole: &str) -> Result<(u64, u64)> {
    let bad = |why: String| Error::invalid("rate", format!("{why} in {whole:?}"));
    let t = item.trim();
    if t.is_empty() {
        return Err(bad("an empty item".into()));
    }
    let (count, rest) = if let Some((c, r)) = t.split_once('/') {
        (c.trim(), r.trim())
    } else {
        let lower = t.to_ascii_lowercase();
        match lower.find(" per ") {
            Some(i) => (t[..i].trim(), t[i + 5..].trim()),
            None => {
                return Err(bad(format!(
                    "{t:?} is not COUNT/UNIT or COUNT per UNIT (like \"5/minute\")"
                )))
            }
        }
    };
    let count = number(count).ok_or_else(|| {
        bad(format!(
            "the count {count:?} of {t:?} is not a whole number of at least 1"
        ))
    })?;
    let unit_at = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (multiple, unit) = rest.split_at(unit_at);
    let multiple = if multiple.is_empty() {
        1
    } else {
        number(multiple).ok_or_else(|| {
            bad(format!(
                "the multiple {multiple:?} of {t:?} is not a whole number of at least 1"
            ))
        })?
    };
    let unit = unit.trim();
    let lower = unit.to_ascii_lowercase();
    let singular = lower.strip_suffix('s').unwrap_or(&lower);
    let secs = UNITS
        .iter()
        .find(|(u, _)| *u == singular)
        .map(|(_, s)| *s)
        .ok_or_else(|| {
            bad(format!(
                "the unit {unit:?} of {t:?} is not second, minute, hour, day, month or year"
            ))
        })?;
    let secs = multiple
        .checked_mul(secs)
        .ok_or_else(|| bad(format!("the window of {t:?} is too long")))?;
    Ok((count, secs))
}

/// A whole number of at least 1, digits only.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n| n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_forms_of_the_limits_package() {
        assert_eq!(
            parse_rate("5/minute").unwrap(),
            [Limit::fixed_window(5, secs(60))]
        );
        assert_eq!(
            parse_rate("10 per second").unwrap(),
            [Limit::fixed_window(10, secs(1))]
        );
        assert_eq!(
            parse_rate("3/5 minutes").unwrap(),
            [Limit::fixed_window(3, secs(300))]
        );
        assert_eq!(
            parse_rate(" 100 / Hour ;1000/day, 2 PER 2 days | 1/month").unwrap(),
            [
                Limit::fixed_window(100, secs(3_600)),
                Limit::fixed_window(1_000, secs(86_400)),
                Limit::fixed_window(2, secs(2 * 86_400)),
                Limit::fixed_window(1, secs(30 * 86_400)),
            ]
        );
        assert_eq!(
            parse_rate("7/year").unwrap(),
            [Limit::fixed_window(7, secs(360 * 86_400))]
        );
    }

    #[test]
    fn other_algorithms() {
        assert_eq!(
            parse_rate_as("10/minute", Algorithm::SlidingWindow).unwrap(),
            [Limit::sliding_window(10, secs(60))]
        );
        assert_eq!(
            parse_rate_as("10/minute", Algorithm::SlidingLog).unwrap(),
            [Limit::sliding_log(10, secs(60))]
        );
        assert_eq!(
            parse_rate_as("20/2 seconds", Algorithm::TokenBucket).unwrap(),
            [Limit::token_bucket(20, 10.0)]
        );
        assert_eq!(
            parse_rate_as("5/second", Algorithm::LeakyBucket).unwrap(),
            [Limit::leaky_bucket(5, 5.0)]
        );
        let e = parse_rate_as("5/second", Algorithm::Concurrency).unwrap_err();
        assert!(e.is_invalid_argument(), "{e}");
        assert!(e.to_string().contains("concurrency"), "{e}");
    }

    #[test]
    fn errors_name_the_bad_part() {
        for (text, part) in [
            ("", "empty"),
            ("   ", "empty"),
            ("5/minute;", "empty item"),
            ("five/minute", "\"five\""),
            ("0/minute", "\"0\""),
            ("-1/minute", "\"-1\""),
            ("5/fortnight", "\"fortnight\""),
            ("5/0 minutes", "\"0\""),
            ("5 minute", "\"5 minute\""),
            ("5/", "\"\""),
            ("99999999999999999999/second", "\"99999999999999999999\""),
            ("1/99999999999999999 years", "too long"),
            ("1/1.5 minutes", "\".5 minutes\""),
        ] {
            let e = parse_rate(text).unwrap_err();
            assert!(e.is_invalid_argument(), "{text:?}: {e}");
            let msg = e.to_string();
            assert!(msg.contains(part), "{text:?}: {msg} does not name {part}");
        }
    }

    #[test]
    fn out_of_range_limits_fail_when_a_policy_is_built() {
        // the parser reads the text; the limit's own validation bounds it
        let too_long = parse_rate("1/2 years").unwrap();
        let e = Policy::try_from(too_long[0].clone()).unwrap_err();
        assert!(e.to_string().contains("366d"), "{e}");
    }
}
