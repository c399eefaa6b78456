//! Charge and give back, in memory: `core/lua/settle.lua` step for step, so that both
//! engines keep the same books. A key's debt is capped at one limit (what a window counts,
//! a sliding log holds or a bucket is filled to never exceeds twice the limit).

use crate::engine::algo::{self, LogEntry, State, SL_EXPIRE, SL_MOD};
use crate::engine::exact;
use crate::engine::outcome::Outcome;
use crate::policy::{Algorithm, Compiled};
use std::collections::VecDeque;

/// Mirrors `SL_SHIFT` of `core/lua/settle.lua`: the most later entries a sliding-log
/// give-back to a reservation's entry rewrites.
pub(crate) const SL_SHIFT: usize = 256;

/// What a settle-script call does (`core/lua/main_settle.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SettleOp {
    /// Consume `units` without denying.
    Charge(u64),
    /// Give back `units` of the current window (the newest entries of a sliding log).
    Refund(u64),
    /// A reservation of `reserved` units recorded at `at` (µs) cost `actual`.
    Settle { reserved: u64, actual: u64, at: u64 },
}

impl SettleOp {
    /// The script's op name and its units, actual and time arguments.
    pub fn args(self) -> (&'static str, u64, u64, u64) {
        match self {
            SettleOp::Charge(u) => ("charge", u, 0, 0),
            SettleOp::Refund(u) => ("refund", u, 0, 0),
            SettleOp::Settle {
                reserved,
                actual,
                at,
            } => ("settle", reserved, actual, at),
        }
    }

    /// The op for one limit of a multi-limit policy that holds at most `cap` units (twice
    /// its limit): what is charged or given back capped at that; a reservation's units
    /// stay as recorded (a sliding log finds its entry by them).
    pub fn capped(self, cap: u64) -> SettleOp {
        match self {
            SettleOp::Charge(u) => SettleOp::Charge(u.min(cap)),
            SettleOp::Refund(u) => SettleOp::Refund(u.min(cap)),
            SettleOp::Settle {
                reserved,
                actual,
                at,
            } => SettleOp::Settle {
                reserved,
                actual: actual.min(reserved + cap),
                at,
            },
        }
    }

    /// The op on a clock shifted by `shift` µs (a window placed per key): a reservation's
    /// time moves with it, so that it settles into the window that admitted it.
    pub fn shifted(self, shift: u64) -> SettleOp {
        match self {
            SettleOp::Settle {
                reserved,
                actual,
                at,
            } => SettleOp::Settle {
                reserved,
                actual,
                at: at + shift,
            },
            op => op,
        }
    }
}

/// Runs `op` on `state` at `now`; the outcome describes the key after it (a peek of one
/// unit, always allowed, as the script answers).
pub(crate) fn apply(c: &Compiled, state: &mut Option<State>, now: u64, op: SettleOp) -> Outcome {
    match op {
        SettleOp::Charge(u) => charge(c, state, now, u),
        SettleOp::Refund(u) => give(c, state, now, u, now, 0),
        SettleOp::Settle {
            reserved,
            actual,
            at,
        } => {
            if actual < reserved {
                give(c, state, now, reserved - actual, at, reserved)
            } else if actual > reserved {
                charge(c, state, now, actual - reserved)
            }
        }
    }
    let p = algo::decide(c, state, now, 1, true, None);
    Outcome {
        allowed: true,
        remaining: p.remaining,
        reset_us: p.reset_us,
        retry_us: None,
        delay_us: 0,
    }
}

/// The window counter (cur, prev) for window `idx` (as the script reads `key:idx`).
fn counters(state: &Option<State>, idx: u64) -> (u64, u64) {
    match state {
        Some(State::Window { idx: i, cur, prev }) if *i == idx => (*cur, *prev),
        Some(State::Window { idx: i, cur, .. }) if *i + 1 == idx => (0, *cur),
        _ => (0, 0),
    }
}

fn charge(c: &Compiled, state: &mut Option<State>, now: u64, cost: u64) {
    let (limit, p) = (c.limit, c.period_us);
    match c.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let idx = now / p;
            let (cur, prev) = counters(state, idx);
            let add = cost.min((2 * limit).saturating_sub(cur));
            if add > 0 {
                *state = Some(State::Window {
                    idx,
                    cur: cur + add,
                    prev,
                });
            }
        }
        Algorithm::SlidingLog => sl_charge(limit, p, state, now, cost),
        Algorithm::TokenBucket | Algorithm::LeakyBucket if c.period_den > 1 => {
            // an exact interval of p/q µs: in ticks of 1/q µs ahead of now (`tat_charge`)
            let q = c.period_den;
            let d = exact::ticks_ahead(state, now, q);
            let nd = (d + cost * p).min(2 * limit * p).max(d);
            if nd > d {
                *state = Some(exact::at(now, nd, q));
            }
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            let tat = match state {
                Some(State::Tat(t)) => (*t).max(now),
                _ => now,
            };
            let new = (tat + cost * p).min(now + 2 * limit * p).max(tat);
            if new > now {
                *state = Some(State::Tat(new));
            }
        }
        Algorithm::Concurrency => {}
    }
}

/// Gives back `cost` units: of a reservation of `reserved` units recorded at `at`, or
/// (`reserved` 0) of the current window / the newest entries.
fn give(c: &Compiled, state: &mut Option<State>, now: u64, cost: u64, at: u64, reserved: u64) {
    let p = c.period_us;
    match c.algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let (idx, now_idx) = (at / p, now / p);
            let counts = if c.algorithm == Algorithm::FixedWindow {
                idx == now_idx
            } else {
                idx + 1 >= now_idx
            };
            if !counts {
                return;
            }
            // the counter of window `idx`: the state's current one or its previous one
            if let Some(State::Window { idx: i, cur, prev }) = state {
                if *i == idx {
                    *cur -= cost.min(*cur);
                } else if *i == idx + 1 {
                    *prev -= cost.min(*prev);
                }
            }
        }
        Algorithm::SlidingLog => {
            if let Some(State::Log(log)) = state {
                sl_give(log, p, now, cost, at, reserved);
            }
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket if c.period_den > 1 => {
            let q = c.period_den;
            let d = exact::ticks_ahead(state, now, q);
            if d > 0 {
                let back = d.saturating_sub(cost.saturating_mul(p));
                *state = (back > 0).then(|| exact::at(now, back, q));
            }
        }
        Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            if let Some(State::Tat(t)) = state {
                let back = t.saturating_sub(cost.saturating_mul(p));
                if back <= now {
                    *state = None;
                } else {
                    *t = back;
                }
            }
        }
        Algorithm::Concurrency => {}
    }
}

/// The live units of a log at `now` (the script's `sl_live`): (expired entries, n, top).
fn sl_live(log: &VecDeque<LogEntry>, w: u64, now: u64) -> (usize, u64, u64) {
    let expired = log.partition_point(|e| e.t + w <= now);
    let top = log.back().map_or(0, |e| (e.before + e.cost) % SL_MOD);
    let n = log
        .get(expired)
        .map_or(0, |b| (top + SL_MOD - b.before) % SL_MOD);
    (expired, n, top)
}

fn sl_charge(limit: u64, w: u64, state: &mut Option<State>, now: u64, cost: u64) {
    if !matches!(state, Some(State::Log(_))) {
        *state = Some(State::Log(VecDeque::new()));
    }
    let Some(State::Log(log)) = state else {
        unreachable!("a log was put there")
    };
    let (expired, n, top) = sl_live(log, w, now);
    let add = cost.min((2 * limit).saturating_sub(n));
    if add == 0 {
        if log.is_empty() {
            *state = None;
        }
        return;
    }
    let newest = log.back().copied();
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
        cost: add,
    });
}

fn sl_give(log: &mut VecDeque<LogEntry>, w: u64, now: u64, cost: u64, at: u64, reserved: u64) {
    let (_, n, _) = sl_live(log, w, now);
    if n == 0 {
        return;
    }
    if reserved == 0 {
        // the newest units first
        let mut left = cost.min(n);
        for _ in 0..SL_EXPIRE {
            if left == 0 {
                return;
            }
            let Some(e) = log.back_mut() else { return };
            if e.t + w <= now {
                return;
            }
            if e.cost > left {
                e.cost -= left;
                return;
            }
            left -= e.cost;
            log.pop_back();
        }
        return;
    }
    if at + w <= now {
        return;
    }
    // the reservation's entry, or (a refund has taken from it since) the newest entries
    // recorded at `at`: entries of one instant expire together
    let Some(first) = log.iter().position(|e| e.t == at) else {
        return;
    };
    let end = first + log.iter().skip(first).take_while(|e| e.t == at).count();
    let mut gives = vec![0u64; end - first];
    let mut left = cost.min(reserved);
    if let Some(j) = (first..end).find(|&j| log[j].cost == reserved) {
        gives[j - first] = left;
    } else {
        for j in (first..end).rev() {
            let g = left.min(log[j].cost);
            gives[j - first] = g;
            left -= g;
        }
    }
    let Some(f) = gives.iter().position(|&g| g > 0) else {
        return;
    };
    let f = first + f;
    if log.len() - f - 1 > SL_SHIFT {
        return;
    }
    let mut shift = 0;
    for (j, e) in log.iter_mut().enumerate().skip(f) {
        let g = if j < end { gives[j - first] } else { 0 };
        e.before = (e.before + SL_MOD - shift % SL_MOD) % SL_MOD;
        e.cost -= g;
        shift += g;
    }
    for j in (f..end).rev() {
        if log[j].cost == 0 {
            log.remove(j);
        }
    }
}
