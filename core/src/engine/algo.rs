//! The six algorithms in Rust, for the in-memory engine. Each function mirrors its Lua
//! script in `core/lua/` operation for operation (including the floating-point expression of the
//! sliding-window estimate), so that both engines give identical decisions for the same
//! sequence of (time, key, cost). `tests/vectors/*.json` holds that promise.

use super::exact;
use super::outcome::Outcome;
use crate::policy::{Algorithm, Compiled};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// The leases of a concurrency limit, as the script keeps them: ordered by (expiry,
/// member "id*units") like the sorted set, with the sum of their units, so that no call
/// walks them (the denial's walk stops after [`CC_WALK`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Leases {
    by_expiry: BTreeMap<(u64, Box<str>), u64>,
    expiry_of: HashMap<Box<str>, u64>,
    held: u64,
}

impl Leases {
    /// Reclaims the leases expired at `now`, at most [`CC_EXPIRE`], earliest first (like
    /// the script: the rest count as held until later calls reclaim them).
    fn expire(&mut self, now: u64) {
        for _ in 0..CC_EXPIRE {
            let Some(entry) = self.by_expiry.first_entry() else {
                break;
            };
            if entry.key().0 > now {
                break;
            }
            let ((_, member), units) = entry.remove_entry();
            self.expiry_of.remove(&member);
            self.held -= units;
        }
    }
    fn latest(&self) -> Option<u64> {
        self.by_expiry.last_key_value().map(|((e, _), _)| *e)
    }
    /// Adds (or, for a member already held, renews) a lease.
    fn hold(&mut self, member: Box<str>, units: u64, expiry: u64) {
        match self.expiry_of.insert(member.clone(), expiry) {
            Some(old) => {
                self.by_expiry.remove(&(old, member.clone()));
            }
            None => self.held += units,
        }
        self.by_expiry.insert((expiry, member), units);
    }
    /// Removes a lease; its expiry when it was there.
    fn take(&mut self, member: &str, units: u64) -> Option<u64> {
        let (member, expiry) = self.expiry_of.remove_entry(member)?;
        self.by_expiry.remove(&(expiry, member));
        self.held -= units;
        Some(expiry)
    }
}

fn lease_member(id: &str, units: u64) -> Box<str> {
    format!("{id}*{units}").into()
}

/// Per-key state of one policy.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// Fixed and sliding window counters: `cur` units in window `idx`, `prev` in `idx - 1`.
    Window { idx: u64, cur: u64, prev: u64 },
    /// Sliding log: one entry per admitted check, oldest first.
    Log(VecDeque<LogEntry>),
    /// Token and leaky bucket: the theoretical arrival (drain) time.
    Tat(u64),
    /// Concurrency: the leases held (boxed: the other states are a few words, and every
    /// entry of the in-memory engine's table is as large as the largest state).
    Leases(Box<Leases>),
    /// Token and leaky bucket with an exact interval `P/Q` µs: the theoretical arrival time
    /// `t + f/Q` µs, `f < Q` (`engine/exact.rs`).
    TatExact { t: u64, f: u64 },
}

impl State {
    /// The instant after which this state is equivalent to no state at all, so it can be
    /// evicted. Mirrors the TTLs the scripts set.
    #[inline]
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
            State::Log(log) => log.back().map_or(0, |e| e.t + c.period_us),
            State::Tat(t) => *t,
            State::Leases(h) => h.latest().unwrap_or(0),
            State::TatExact { t, f } => t + u64::from(*f > 0),
        }
    }
}

/// Runs one check. `state` is `None` for a key never seen (or evicted); it is replaced when
/// the algorithm writes. `cost` has already been clamped to at most `limit + 1`.
/// (Inline, with the two most common algorithms: a check then makes no call and copies no
/// outcome from the algorithm to the engine.)
#[inline(always)]
pub(crate) fn decide(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    lease_id: Option<&str>,
) -> Outcome {
    match c.algorithm {
        Algorithm::FixedWindow => fixed_window(c, state, now, cost, peek),
        Algorithm::SlidingWindow => sliding_window(c, state, now, cost, peek),
        Algorithm::SlidingLog => sliding_log(c, state, now, cost, peek),
        Algorithm::TokenBucket if c.period_den > 1 => exact::gcra(c, state, now, cost, peek, false),
        Algorithm::LeakyBucket if c.period_den > 1 => exact::gcra(c, state, now, cost, peek, true),
        Algorithm::TokenBucket => gcra(c, state, now, cost, peek, false),
        Algorithm::LeakyBucket => gcra(c, state, now, cost, peek, true),
        Algorithm::Concurrency => concurrency(c, state, now, cost, peek, lease_id),
    }
}

/// Writes window counters, in place when the state holds counters already (replacing it
/// would run the state's drop glue on every check).
#[inline(always)]
fn set_window(state: &mut Option<State>, idx: u64, cur: u64, prev: u64) {
    match state {
        Some(State::Window {
            idx: i,
            cur: c,
            prev: p,
        }) => (*i, *c, *p) = (idx, cur, prev),
        _ => *state = Some(State::Window { idx, cur, prev }),
    }
}

/// Writes a theoretical arrival time, in place when the state holds one already.
#[inline(always)]
fn set_tat(state: &mut Option<State>, tat: u64) {
    match state {
        Some(State::Tat(t)) => *t = tat,
        _ => *state = Some(State::Tat(tat)),
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

#[inline(always)]
fn fixed_window(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
) -> Outcome {
    let (limit, w) = (c.limit, c.period_us);
    let idx = now / w;
    // A clock gone back into the window before the key's newest: Redis keeps a counter
    // per window, so that window's counter decides, and the newest keeps its own. Here
    // the earlier window's counter is the one kept as `prev`.
    let back = matches!(state, Some(State::Window { idx: i, .. }) if idx + 1 == *i);
    let (used, prev) = match (back, &*state) {
        (true, Some(State::Window { prev, .. })) => (*prev, 0),
        _ => window_counts(state, idx),
    };
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
    match state {
        Some(State::Window { prev: p, .. }) if back => *p = used + cost,
        _ => set_window(state, idx, used + cost, prev),
    }
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
        set_window(state, idx, cur + cost, prev);
        return Outcome::allow(
            sw_remaining(prev, cur + cost, elapsed, w, limit),
            2 * w - elapsed,
            0,
        );
    }
    // the smallest e in [lo, hi] where the cost fits (hi when none is smaller): a bisection,
    // as the script does; `sw_fits` only grows with e
    let first_fit = |p: u64, cur: u64, mut lo: u64, mut hi: u64| {
        while lo < hi {
            let mid = (lo + hi) / 2;
            if sw_fits(p, cur, mid, w, cost, limit) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    };
    let retry = if cur + cost <= limit {
        // wait in this window for the previous window's weight to decay (prev > 0 here)
        first_fit(prev, cur, elapsed + 1, w) - elapsed
    } else {
        // in the next window, where this window's count becomes the previous one
        w - elapsed + first_fit(cur, 0, 0, w)
    };
    Outcome::deny(
        sw_remaining(prev, cur, elapsed, w, limit),
        reset,
        Some(retry),
    )
}

/// Mirrors `SL_MOD` of `core/lua/sliding_log.lua`: `before` counts units modulo 2^52, so the
/// script's doubles hold it exactly.
pub(crate) const SL_MOD: u64 = 1 << 52;
/// Mirrors `SL_EXPIRE`: the most expired entries one write removes.
pub(crate) const SL_EXPIRE: usize = 64;

/// One admitted check of a sliding log: `cost` units recorded at `t` (µs), after `before`
/// units (mod [`SL_MOD`]) were recorded on the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogEntry {
    pub t: u64,
    pub before: u64,
    pub cost: u64,
}

/// Weighted sliding log, step for step as `core/lua/sliding_log.lua`: the live units are the
/// newest entry's `before + cost` minus the oldest live entry's `before`, so no call walks
/// the entries or depends on the cost.
fn sliding_log(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
) -> Outcome {
    let (limit, w) = (c.limit, c.period_us);
    let mut empty = VecDeque::new();
    let log = match state {
        Some(State::Log(l)) => l,
        _ => &mut empty,
    };
    // entries recorded at t <= now - window have expired
    let expired = log.partition_point(|e| e.t + w <= now);
    let newest = log.back().copied();
    let top = newest.map_or(0, |e| (e.before + e.cost) % SL_MOD);
    let base = log.get(expired).map(|e| e.before);
    let n = base.map_or(0, |b| (top + SL_MOD - b) % SL_MOD);
    let reset_after = newest.map_or(0, |e| (e.t + w).saturating_sub(now));
    if cost > limit {
        return Outcome::deny(limit.saturating_sub(n), reset_after, None);
    }
    if n + cost > limit {
        // the first live entry whose units bring the count from `base` to k
        let (k, base) = (n + cost - limit, base.unwrap_or(0));
        let (mut lo, mut hi) = (expired, log.len() - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let e = log[mid];
            if (e.before + e.cost + SL_MOD - base) % SL_MOD >= k {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let t = log[lo].t;
        return Outcome::deny(limit.saturating_sub(n), reset_after, Some(t + w - now));
    }
    if peek {
        return Outcome::allow(limit - n, reset_after, 0);
    }
    log.drain(..expired.min(SL_EXPIRE));
    let mut at = now;
    if let Some(e) = newest {
        at = at.max(e.t);
        if top < e.before && at == e.t {
            at += 1;
        }
    }
    log.push_back(LogEntry {
        t: at,
        before: top,
        cost,
    });
    if !matches!(state, Some(State::Log(_))) {
        *state = Some(State::Log(empty));
    }
    Outcome::allow(limit - n - cost, at + w - now, 0)
}

#[inline(always)]
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
    // (more than `burst` ahead when the clock went back: nothing is available)
    let available = burst.saturating_sub(tat - now) / interval;
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
    set_tat(state, new_tat);
    Outcome::allow((burst - (new_tat - now)) / interval, new_tat - now, delay)
}

fn concurrency(
    c: &Compiled,
    state: &mut Option<State>,
    now: u64,
    cost: u64,
    peek: bool,
    lease_id: Option<&str>,
) -> Outcome {
    let (max, ttl) = (c.limit, c.period_us);
    let mut empty: Option<Box<Leases>> = None;
    let leases = match state {
        Some(State::Leases(h)) => h,
        _ => empty.insert(Box::default()),
    };
    // like the script, every call (a peek too) reclaims up to CC_EXPIRE expired leases
    leases.expire(now);
    let n = leases.held;
    let reset_after = |l: &Leases| l.latest().map_or(0, |e| e.saturating_sub(now));
    if cost > max {
        return Outcome::deny(max.saturating_sub(n), reset_after(leases), None);
    }
    if n + cost > max {
        // with no releases, the k-th earliest expiring unit frees enough: walk at most
        // CC_WALK leases, else the time every lease has expired
        let mut k = n + cost - max;
        let mut at = now + reset_after(leases);
        let live = leases.by_expiry.range((now + 1, Box::<str>::from(""))..);
        for ((e, _), units) in live.take(CC_WALK) {
            if *units >= k {
                at = *e;
                break;
            }
            k -= units;
        }
        return Outcome::deny(max.saturating_sub(n), reset_after(leases), Some(at - now));
    }
    // (no lease: nothing can be taken, since nothing could give it back; callers refuse
    // such a check before it gets here, `unleased` and `check_all`, so it answers as a peek)
    let Some(lease_id) = lease_id.filter(|_| !peek) else {
        return Outcome::allow(max - n, reset_after(leases), 0);
    };
    leases.hold(lease_member(lease_id, cost), cost, now + ttl);
    let (n, reset) = (leases.held, reset_after(leases));
    if let Some(new) = empty {
        *state = Some(State::Leases(new));
    }
    Outcome::allow(max - n, reset, 0)
}

/// Mirrors `CC_WALK` of `core/lua/concurrency.lua`: the most leases a denied check's
/// `retry_after` walks.
pub(crate) const CC_WALK: usize = 64;
/// Mirrors `CC_EXPIRE`: the most expired leases one call reclaims.
pub(crate) const CC_EXPIRE: usize = 128;

/// Releases lease `id` of `units` units; true when it was held (and had not expired).
pub(crate) fn release(state: &mut Option<State>, id: &str, units: u64, now: u64) -> bool {
    match state {
        Some(State::Leases(l)) => l
            .take(&lease_member(id, units), units)
            .is_some_and(|expiry| expiry > now),
        _ => false,
    }
}
