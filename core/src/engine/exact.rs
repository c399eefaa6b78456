//! The GCRA of both buckets with an exact emission interval of `P/Q` µs per unit
//! (`policy/precision.rs`), step for step as the `q ~= ''` branch of `ALGO.tb` and `ALGO.lb`
//! in `core/lua/`. The theoretical arrival time is kept as `t + f/Q` µs; the arithmetic
//! runs in ticks of `1/Q` µs counted from `now`, where every quantity stays below 2^53,
//! and durations are reported in whole µs rounded up (never "retry now" too early).

use super::algo::State;
use crate::engine::outcome::Outcome;
use crate::policy::precision::TICKS_AHEAD;
use crate::policy::Compiled;

/// Ticks from `now` to the stored theoretical arrival time (0 when it has passed); at most
/// `TICKS_AHEAD` µs' worth, as in the script.
#[inline]
pub(crate) fn ticks_ahead(state: &Option<State>, now: u64, q: u64) -> u64 {
    match state {
        Some(State::TatExact { t, f }) if *t >= now => (*t - now).min(TICKS_AHEAD / q) * q + f,
        _ => 0,
    }
}

/// The state `ticks` ticks after `now`.
#[inline]
pub(crate) fn at(now: u64, ticks: u64, q: u64) -> State {
    State::TatExact {
        t: now + ticks / q,
        f: ticks % q,
    }
}

pub(crate) fn gcra(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    shaper: bool,
) -> Outcome {
    let (capacity, p, q) = (c.limit, c.period_us, c.period_den);
    let up = |ticks: u64| ticks.div_ceil(q);
    let d = ticks_ahead(state, now, q);
    let burst = capacity * p;
    let available = burst.saturating_sub(d) / p;
    if cost > capacity {
        return Outcome::deny(available, up(d), None);
    }
    let nd = d + cost * p;
    if nd > burst {
        return Outcome::deny(available, up(d), Some(up(nd - burst)));
    }
    let delay = if shaper { up(d) } else { 0 };
    if peek {
        return Outcome::allow(available, up(d), delay);
    }
    *state = Some(at(now, nd, q));
    Outcome::allow((burst - nd) / p, up(nd), delay)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::algo::decide;
    use crate::policy::{Limit, Policy};

    fn compiled(l: Limit) -> Compiled {
        Policy::new("p", l).unwrap().0.compiled
    }

    /// From `start` to `end` (both included) every `step` µs, a greedy caller takes every
    /// whole unit available (a peek, then a check of that many): the units admitted.
    fn admitted(c: &Compiled, start: u64, end: u64, step: u64) -> u64 {
        let mut state = None;
        let mut n = 0;
        let mut take = |now: u64| {
            let free = decide(c, &mut state, now, 1, true, None).remaining;
            if free > 0 {
                assert!(decide(c, &mut state, now, free, false, None).allowed);
                n += free;
            }
        };
        let mut now = start;
        while now < end {
            take(now);
            now += step;
        }
        take(end);
        n
    }

    /// 300,000/s is 10/3 µs per token: over 1,000 simulated seconds a bucket admits its
    /// capacity plus exactly 300,000,000 refilled tokens (rounded to 3 µs per token, it
    /// admitted 333,333,333).
    #[test]
    fn three_hundred_thousand_per_second_is_exact_over_a_long_time() {
        let c = compiled(Limit::token_bucket(3_000_000, 300_000.0));
        assert_eq!((c.period_us, c.period_den), (10, 3));
        let t0 = 1_800_000_000_000_000;
        let end = t0 + 1_000_000_000;
        assert_eq!(admitted(&c, t0, end, 999_983), 3_000_000 + 300_000_000);
        // asked every µs for 10 s, one unit at a time: the same count
        let c = compiled(Limit::token_bucket(100, 300_000.0));
        let (mut state, mut n) = (None, 0);
        for now in t0..=t0 + 10_000_000 {
            n += u64::from(decide(&c, &mut state, now, 1, false, None).allowed);
        }
        assert_eq!(n, 100 + 3_000_000);
        // and the leaky bucket the same
        let l = compiled(Limit::leaky_bucket(3_000_000, 300_000.0));
        assert_eq!(admitted(&l, t0, end, 999_983), 3_000_000 + 300_000_000);
    }

    /// 5,000,000 per minute (written as 5e6/60 per second): 12 µs per token, over a day.
    #[test]
    fn five_million_per_minute_is_exact_over_a_day() {
        let c = compiled(Limit::token_bucket(1_000_000, 5_000_000.0 / 60.0));
        assert_eq!((c.period_us, c.period_den), (12, 1));
        let t0 = 1_800_000_000_000_000;
        let day = 86_400_000_000;
        assert_eq!(
            admitted(&c, t0, t0 + day, 1_000_003),
            1_000_000 + 1_440 * 5_000_000
        );
    }

    /// A rate of 7 per second (1e6/7 µs per token, once rounded to 142,857 µs: 7.000007/s):
    /// over a simulated day, exactly 7 × 86,400 tokens refill.
    #[test]
    fn seven_per_second_is_exact_over_a_day() {
        let c = compiled(Limit::token_bucket(10, 7.0));
        assert_eq!((c.period_us, c.period_den), (1_000_000, 7));
        let t0 = 1_800_000_000_000_000;
        assert_eq!(
            admitted(&c, t0, t0 + 86_400_000_000, 999_999),
            10 + 7 * 86_400
        );
    }

    /// Retry and reset are rounded up to whole µs, and waiting `retry_after` admits.
    #[test]
    fn durations_round_up_and_retry_after_is_enough() {
        let c = compiled(Limit::token_bucket(2, 300_000.0));
        let t0 = 1_000_000;
        let mut s = None;
        let o = decide(&c, &mut s, t0, 2, false, None);
        assert!(o.allowed);
        assert_eq!(
            (o.remaining, o.reset_us),
            (0, 7),
            "20/3 µs to full, rounded up"
        );
        let o = decide(&c, &mut s, t0, 1, false, None);
        assert_eq!(
            (o.allowed, o.retry_us),
            (false, Some(4)),
            "10/3 µs, rounded up"
        );
        assert!(!decide(&c, &mut s, t0 + 3, 1, true, None).allowed);
        assert!(decide(&c, &mut s, t0 + 4, 1, false, None).allowed);
        // a clock far behind the state: nothing available, no overflow
        let o = decide(&c, &mut s, 5, 1, false, None);
        assert!(!o.allowed && o.remaining == 0);
    }

    /// The adaptive scale and `on_error: local`'s share keep the denominator: half of
    /// 300,000/s is 20/3 µs per token, exactly 150,000/s.
    #[test]
    fn scaled_and_shared_rates_stay_exact() {
        let c = compiled(Limit::token_bucket(3_000_000, 300_000.0));
        let half = c.share(2);
        assert_eq!(
            (half.limit, half.period_us, half.period_den),
            (1_500_000, 20, 3)
        );
        assert_eq!(half.window_us(), 10_000_000);
        let t0 = 1_800_000_000_000_000;
        assert_eq!(
            admitted(&half, t0, t0 + 1_000_000_000, 999_983),
            1_500_000 + 150_000_000
        );
    }

    /// Sub-µs intervals (2,000,000/s is 1/2 µs) are exact too.
    #[test]
    fn sub_microsecond_intervals() {
        let c = compiled(Limit::token_bucket(10, 2_000_000.0));
        assert_eq!((c.period_us, c.period_den), (1, 2));
        assert_eq!(c.window_us(), 5);
        let t0 = 1_800_000_000_000_000;
        // two refill per µs
        assert_eq!(admitted(&c, t0, t0 + 1_000_000, 3), 10 + 2_000_000);
        let mut s = None;
        let o = decide(&c, &mut s, t0, 10, false, None);
        assert!(o.allowed && o.reset_us == 5);
        let o = decide(&c, &mut s, t0, 3, false, None);
        assert_eq!(o.retry_us, Some(2), "3/2 µs, rounded up");
    }
}
