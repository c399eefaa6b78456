//! Exact refill rates: a bucket's emission interval as a reduced fraction `P/Q` µs per
//! unit, so that 300,000/s (10/3 µs) or 5,000,000 per minute (12 µs) are kept exactly
//! instead of being rounded to whole µs. Both engines then run the GCRA in ticks of
//! `1/Q` µs relative to `now` (`engine/algo.rs` `gcra_exact`, `core/lua/token_bucket.lua`),
//! every quantity an integer below 2^53 so that Lua's doubles hold it exactly.

use crate::error::{Error, Result};

/// The most units per second a bucket may refill or leak: an interval of 10 ns.
pub const MAX_RATE_PER_SEC: f64 = 100_000_000.0;
/// The largest `capacity × P` (a full bucket in ticks of `1/Q` µs) accepted, as
/// `MAX_BUCKET_SPAN_US` is for whole µs: with the cost at most `capacity + 1` and a
/// state at most 2^52 ticks ahead (`TICKS_AHEAD`), every sum stays below 2^53.
pub const MAX_SPAN_TICKS: u64 = 1 << 50;
/// How far ahead of `now` (in ticks) a stored theoretical arrival time is read as being at
/// most: only a clock that went back by more than 2^52 ticks reaches it, and then nothing is
/// available either way. Mirrors `TQ_AHEAD` of `core/lua/token_bucket.lua`.
pub(crate) const TICKS_AHEAD: u64 = 1 << 52;

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The simplest fraction `n/d` (smallest `d`, then smallest `n`) whose nearest double is
/// `x`: what a person meant by the number written (`83333.33333333333` is 250000/3, `0.1`
/// is 1/10). `x` must be finite and positive, at least 2^-60 and below 2^60.
pub(crate) fn simplest_fraction(x: f64) -> (u128, u128) {
    // x exactly, as num/den: a double is mantissa × 2^exp
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    let mant = if exp == 0 {
        (bits & ((1 << 52) - 1)) << 1
    } else {
        (bits & ((1 << 52) - 1)) | (1 << 52)
    } as u128;
    let e = exp - 1075;
    let (mut a, mut b) = if e >= 0 {
        (mant << e, 1u128)
    } else {
        (mant, 1u128 << (-e))
    };
    let rounds_to_x = |n: u128, d: u128| n as f64 / d as f64 == x;
    // continued fraction convergents h/k; between two convergents, the semiconvergents
    // (h2 + j·h1)/(k2 + j·k1) approach x from one side, so the first one that rounds to x
    // is found by bisection on j
    let (mut h1, mut k1, mut h2, mut k2) = (1u128, 0u128, 0u128, 1u128);
    loop {
        let q = a / b;
        let (h, k) = (q * h1 + h2, q * k1 + k2);
        if rounds_to_x(h, k) {
            let (mut lo, mut hi) = (1u128, q);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if rounds_to_x(mid * h1 + h2, mid * k1 + k2) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            // (j = 0 would be h2/k2, the convergent before, which did not round to x)
            return (lo * h1 + h2, lo * k1 + k2);
        }
        (h2, k2, h1, k1) = (h1, k1, h, k);
        let r = a - q * b;
        if r == 0 {
            // (not reached: the last convergent is x itself)
            return (h, k);
        }
        (a, b) = (b, r);
    }
}

/// The emission interval of `per_sec` units per second as a reduced fraction `(P, Q)` of
/// µs per unit, validated so that a bucket of `capacity` units runs exactly in both engines.
pub(crate) fn interval(field: &str, name: &str, per_sec: f64, capacity: u64) -> Result<(u64, u64)> {
    let err = |why: String| Error::config(format!("{field}.{name}"), why);
    if !per_sec.is_finite() || per_sec <= 0.0 {
        return Err(err(format!("must be a positive number, got {per_sec}")));
    }
    if per_sec > MAX_RATE_PER_SEC {
        return Err(err(format!(
            "must be at most {MAX_RATE_PER_SEC} per second, got {per_sec}"
        )));
    }
    if 1.0 / per_sec > crate::policy::MAX_PERIOD_US as f64 / 1e6 {
        return Err(err(format!(
            "must be at least one unit per 366 days, got {per_sec}"
        )));
    }
    let (n, d) = simplest_fraction(per_sec);
    // per_sec = n/d units per second: an interval of 1e6·d/n µs per unit
    let (num, den) = (1_000_000 * d, n);
    let g = gcd(num, den);
    let (p, q) = (num / g, den / g);
    let fraction = if d == 1 {
        format!("{n}")
    } else {
        format!("{n}/{d}")
    };
    if p > MAX_SPAN_TICKS as u128 || q > MAX_SPAN_TICKS as u128 {
        return Err(err(format!(
            "{per_sec} per second is {fraction} per second, whose interval of {p}/{q} µs per \
             unit has too large a numerator or denominator to be kept exactly; use a rate \
             with a smaller denominator"
        )));
    }
    let (p, q) = (p as u64, q as u64);
    match capacity.checked_mul(p) {
        Some(span) if span <= MAX_SPAN_TICKS => Ok((p, q)),
        _ if q == 1 => Err(err(format!(
            "refilling {capacity} units at {per_sec}/s would take more than 35 years"
        ))),
        _ => Err(err(format!(
            "{per_sec} per second is {fraction} per second, an interval of {p}/{q} µs per \
             unit; a full bucket of {capacity} units is then {capacity} × {p} ticks of 1/{q} \
             µs, more than 2^50, which the Redis scripts' doubles cannot keep exact: lower \
             the capacity or use a rate with a smaller denominator"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simplest_fractions_are_what_was_meant() {
        assert_eq!(simplest_fraction(300_000.0), (300_000, 1));
        assert_eq!(simplest_fraction(5_000_000.0 / 60.0), (250_000, 3));
        assert_eq!(simplest_fraction(0.1), (1, 10));
        assert_eq!(simplest_fraction(1.0 / 3.0), (1, 3));
        assert_eq!(simplest_fraction(2.5), (5, 2));
        assert_eq!(simplest_fraction(123.456789), (123_456_789, 1_000_000));
        assert_eq!(simplest_fraction(1e8), (100_000_000, 1));
        // 1/3 rounded to 0.333 is 333/1000, not 1/3
        assert_eq!(simplest_fraction(0.333), (333, 1000));
        for x in [
            0.7,
            1e-7,
            33.3,
            1e6 / 7.0,
            17.0 / 13.0,
            86_400.0_f64.recip(),
        ] {
            let (n, d) = simplest_fraction(x);
            assert_eq!(n as f64 / d as f64, x, "{x}");
        }
    }

    #[test]
    fn intervals_are_exact_reduced_fractions() {
        let i = |r: f64, c: u64| interval("p", "refill_per_sec", r, c);
        assert_eq!(i(300_000.0, 100).unwrap(), (10, 3));
        assert_eq!(i(5_000_000.0 / 60.0, 100).unwrap(), (12, 1));
        assert_eq!(i(10.0, 100).unwrap(), (100_000, 1));
        assert_eq!(i(0.5, 1).unwrap(), (2_000_000, 1));
        assert_eq!(i(2_000_000.0, 1).unwrap(), (1, 2));
        assert_eq!(i(7.0, 1).unwrap(), (1_000_000, 7));
        // refused, saying why, rather than rounded
        let e = i(123.456789, 1_000_000).unwrap_err().to_string();
        assert!(e.contains("123456789/1000000") && e.contains("2^50"), "{e}");
        assert!(i(1e9, 1).unwrap_err().to_string().contains("at most"));
        assert!(i(0.0, 1).is_err() && i(f64::NAN, 1).is_err() && i(-1.0, 1).is_err());
        assert!(i(1e-9, 1).unwrap_err().to_string().contains("366 days"));
        assert!(i(0.001, 1_000_000_000)
            .unwrap_err()
            .to_string()
            .contains("35 years"));
    }
}
