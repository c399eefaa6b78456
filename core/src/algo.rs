//! The six algorithms in Rust, for the in-memory engine. Each function mirrors its Lua
//! script in `core/lua/` operation for operation (including the floating-point expression of the
//! sliding-window estimate), so that both engines give identical decisions for the same
//! sequence of (time, key, cost). `tests/vectors/*.json` holds that promise.

use crate::limit::{Algorithm, Compiled};
use std::collections::VecDeque;

/// What an algorithm decided, in integers (µs). `retry_us` is `None` when absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub allowed: bool,
    pub remaining: u64,
    pub reset_us: u64,
    pub retry_us: Option<u64>,
    pub delay_us: u64,
}

impl Outcome {
    fn deny(remaining: u64, reset_us: u64, retry_us: Option<u64>) -> Outcome {
        Outcome {
            allowed: false,
            remaining,
            reset_us,
            retry_us,
            delay_us: 0,
        }
    }
    fn allow(remaining: u64, reset_us: u64, delay_us: u64) -> Outcome {
        Outcome {
            allowed: true,
            remaining,
            reset_us,
            retry_us: None,
            delay_us,
        }
    }
}

/// One lease of a concurrency limit: `units` held until `expiry_us`.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub expiry_us: u64,
    pub id: Box<str>,
    pub units: u64,
}

/// Per-key state of one policy.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// Fixed and sliding window counters: `cur` units in window `idx`, `prev` in `idx - 1`.
    Window { idx: u64, cur: u64, prev: u64 },
    /// Sliding log: admission times of live units, oldest first.
    Log(VecDeque<u64>),
    /// Token and leaky bucket: the theoretical arrival (drain) time.
    Tat(u64),
    /// Concurrency: the leases held.
    Leases(Vec<Held>),
}

impl State {
    /// The instant after which this state is equivalent to no state at all, so it can be
    /// evicted. Mirrors the TTLs the scripts set.
    pub fn expires_at(&self, c: &Compiled) -> u64 {
        match self {
            State::Window { idx, .. } => {
                let windows = if c.algorithm == Algorithm::SlidingWindow {
                    2
                } else {
                    1
                };
                (idx + windows) * c.period_us
            }
            State::Log(log) => log.back().map_or(0, |t| t + c.period_us),
            State::Tat(t) => *t,
            State::Leases(h) => h.iter().map(|l| l.expiry_us).max().unwrap_or(0),
        }
    }
}

/// Runs one check. `state` is `None` for a key never seen (or evicted); it is replaced when
/// the algorithm writes. `cost` has already been clamped to at most `limit + 1`.
pub(crate) fn decide(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    lease_id: &str,
) -> Outcome {
    match c.algorithm {
        Algorithm::FixedWindow => fixed_window(c, state, now, cost, peek),
        Algorithm::SlidingWindow => sliding_window(c, state, now, cost, peek),
        Algorithm::SlidingLog => sliding_log(c, state, now, cost, peek),
        Algorithm::TokenBucket => gcra(c, state, now, cost, peek, false),
        Algorithm::LeakyBucket => gcra(c, state, now, cost, peek, true),
        Algorithm::Concurrency => concurrency(c, state, now, cost, peek, lease_id),
    }
}

/// Counters (cur, prev) for window `idx`, as the scripts read `key:idx` and `key:idx-1`.
fn window_counts(state: &Option<State>, idx: u64) -> (u64, u64) {
    match state {
        Some(State::Window { idx: i, cur, prev }) if *i == idx => (*cur, *prev),
        Some(State::Window { idx: i, cur, .. }) if *i + 1 == idx => (0, *cur),
        _ => (0, 0),
    }
}

fn fixed_window(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
) -> Outcome {
    let (limit, w) = (c.limit, c.period_us);
    let idx = now / w;
    let (used, prev) = window_counts(state, idx);
    let reset = (idx + 1) * w - now;
    if cost > limit {
        return Outcome::deny(limit.saturating_sub(used), reset, None);
    }
    if used + cost > limit {
        return Outcome::deny(limit.saturating_sub(used), reset, Some(reset));
    }
    if peek {
        return Outcome::allow(limit - used, reset, 0);
    }
    *state = Some(State::Window {
        idx,
        cur: used + cost,
        prev,
    });
    Outcome::allow(limit - used - cost, reset, 0)
}

/// `p * (w - e) / w + c + cost <= limit`, evaluated exactly as the Lua script does.
#[inline]
fn sw_fits(p: u64, cur: u64, e: u64, w: u64, cost: u64, limit: u64) -> bool {
    p as f64 * (w as f64 - e as f64) / w as f64 + cur as f64 + cost as f64 <= limit as f64
}

fn sw_remaining(p: u64, cur: u64, e: u64, w: u64, limit: u64) -> u64 {
    let r = (limit as f64 - (p as f64 * (w as f64 - e as f64) / w as f64 + cur as f64)).floor();
    if r < 0.0 {
        0
    } else {
        r as u64
    }
}

fn sliding_window(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
) -> Outcome {
    let (limit, w) = (c.limit, c.period_us);
    let idx = now / w;
    let elapsed = now - idx * w;
    let (cur, prev) = window_counts(state, idx);
    let reset = if cur > 0 {
        2 * w - elapsed
    } else if prev > 0 {
        w - elapsed
    } else {
        0
    };
    if cost > limit {
        return Outcome::deny(sw_remaining(prev, cur, elapsed, w, limit), reset, None);
    }
    if sw_fits(prev, cur, elapsed, w, cost, limit) {
        if peek {
            return Outcome::allow(sw_remaining(prev, cur, elapsed, w, limit), reset, 0);
        }
        *state = Some(State::Window {
            idx,
            cur: cur + cost,
            prev,
        });
        return Outcome::allow(
            sw_remaining(prev, cur + cost, elapsed, w, limit),
            2 * w - elapsed,
            0,
        );
    }
    let retry = if cur + cost <= limit {
        // wait in this window for the previous window's weight to decay (prev > 0 here)
        let guess = (w as f64 - ((limit - cur - cost) as f64) * w as f64 / prev as f64).ceil();
        let mut e = (guess.max(elapsed as f64) as u64).min(w);
        while e < w && !sw_fits(prev, cur, e, w, cost, limit) {
            e += 1;
        }
        while e > elapsed + 1 && sw_fits(prev, cur, e - 1, w, cost, limit) {
            e -= 1;
        }
        e.min(w) - elapsed
    } else {
        let mut e = 0;
        if cur > 0 {
            let guess = (w as f64 - ((limit - cost) as f64) * w as f64 / cur as f64).ceil();
            if guess > 0.0 {
                e = (guess as u64).min(w);
            }
        }
        while e < w && !sw_fits(cur, 0, e, w, cost, limit) {
            e += 1;
        }
        while e > 0 && sw_fits(cur, 0, e - 1, w, cost, limit) {
            e -= 1;
        }
        w - elapsed + e
    };
    Outcome::deny(
        sw_remaining(prev, cur, elapsed, w, limit),
        reset,
        Some(retry),
    )
}

fn sliding_log(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
) -> Outcome {
    let (limit, w) = (c.limit, c.period_us);
    let horizon = now.saturating_sub(w);
    let mut empty = VecDeque::new();
    let log = match state {
        Some(State::Log(l)) => l,
        _ => &mut empty,
    };
    // units with time <= now - window have expired
    let live_from = log.partition_point(|t| *t <= horizon);
    let n = (log.len() - live_from) as u64;
    let reset_after = |log: &VecDeque<u64>| log.back().map_or(0, |t| (t + w).saturating_sub(now));
    if cost > limit {
        return Outcome::deny(limit.saturating_sub(n), reset_after(log), None);
    }
    if n + cost > limit {
        let k = (n + cost - limit) as usize;
        let t = log[live_from + k - 1];
        return Outcome::deny(limit - n, reset_after(log), Some(t + w - now));
    }
    if peek {
        return Outcome::allow(limit - n, reset_after(log), 0);
    }
    log.drain(..live_from);
    let at = log.partition_point(|t| *t <= now);
    for _ in 0..cost {
        log.insert(at, now);
    }
    let reset = reset_after(log);
    if !matches!(state, Some(State::Log(_))) {
        *state = Some(State::Log(empty));
    }
    Outcome::allow(limit - n - cost, reset, 0)
}

fn gcra(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    shaper: bool,
) -> Outcome {
    let (capacity, interval) = (c.limit, c.period_us);
    let tat = match state {
        Some(State::Tat(t)) => (*t).max(now),
        _ => now,
    };
    let burst = capacity * interval;
    let available = (burst - (tat - now)) / interval;
    if cost > capacity {
        return Outcome::deny(available, tat - now, None);
    }
    let new_tat = tat + cost * interval;
    if new_tat - now > burst {
        return Outcome::deny(available, tat - now, Some(new_tat - burst - now));
    }
    let delay = if shaper { tat - now } else { 0 };
    if peek {
        return Outcome::allow(available, tat - now, delay);
    }
    *state = Some(State::Tat(new_tat));
    Outcome::allow((burst - (new_tat - now)) / interval, new_tat - now, delay)
}

fn concurrency(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    lease_id: &str,
) -> Outcome {
    let (max, ttl) = (c.limit, c.period_us);
    let mut empty = Vec::new();
    let held = match state {
        Some(State::Leases(h)) => h,
        _ => &mut empty,
    };
    if !peek {
        held.retain(|l| l.expiry_us > now);
    }
    let n: u64 = held
        .iter()
        .filter(|l| l.expiry_us > now)
        .map(|l| l.units)
        .sum();
    let reset_after = |held: &Vec<Held>| {
        held.iter()
            .map(|l| l.expiry_us)
            .max()
            .filter(|e| *e > now)
            .map_or(0, |e| e - now)
    };
    if cost > max {
        return Outcome::deny(max.saturating_sub(n), reset_after(held), None);
    }
    if n + cost > max {
        // with no releases, the (n + cost - max)-th earliest expiring unit frees enough
        let mut expiries: Vec<(u64, u64)> = held
            .iter()
            .filter(|l| l.expiry_us > now)
            .map(|l| (l.expiry_us, l.units))
            .collect();
        expiries.sort_unstable();
        let mut k = n + cost - max;
        let mut at = now;
        for (e, units) in expiries {
            at = e;
            if units >= k {
                break;
            }
            k -= units;
        }
        return Outcome::deny(max - n, reset_after(held), Some(at - now));
    }
    if peek {
        return Outcome::allow(max - n, reset_after(held), 0);
    }
    held.push(Held {
        expiry_us: now + ttl,
        id: lease_id.into(),
        units: cost,
    });
    let reset = reset_after(held);
    if !matches!(state, Some(State::Leases(_))) {
        *state = Some(State::Leases(empty));
    }
    Outcome::allow(max - n - cost, reset, 0)
}

/// Releases lease `id`; true when it was held.
pub(crate) fn release(state: &mut Option<State>, id: &str) -> bool {
    if let Some(State::Leases(h)) = state {
        let before = h.len();
        h.retain(|l| &*l.id != id);
        return h.len() != before;
    }
    false
}
