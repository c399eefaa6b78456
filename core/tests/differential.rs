//! Differential test of the two engines: the in-memory engine (the algorithms of
//! `core/src/engine/algo.rs`) and the Lua scripts on a real `redis-server`, each with an injected
//! `ManualClock`, are driven through the same random sequences of checks, peeks, leases
//! (acquire, release), resets, layered checks and bursts, on all six algorithms with random
//! limits and periods and costs from 1 to past the limit. Every decision must be equal in
//! every field (allowed, limit, remaining, reset_after, retry_after, delay, policy, layer,
//! window), every release must return the same.
//!
//! The Redis side takes the three ways a check reaches a script: async calls (the
//! pipelined connection, `main_check.lua`), blocking calls (`*_blocking`: the blocking
//! connection on the caller's thread), and bursts: checks issued together on the I/O
//! runtime, which the pipe's writer sends as one batch script call per algorithm
//! (`main_batch.lua`; the test counts the script calls to prove it). A burst is decided
//! like the same checks one after another.
//!
//! Redis expires keys on its own real clock (PEXPIRE), the injected clock does not move
//! it. So that no key can expire, in real time, before the injected clock is done with it,
//! every TTL a script sets is at least `MIN_TTL_US` (far longer than a case takes): windows
//! and lease TTLs are at least that long, a bucket refills at most one unit per that time,
//! and a fixed window is never entered within `MIN_TTL_US` of its end (such a time moves
//! on to the window's boundary, which puts many steps exactly on a boundary).
//!
//! The clock also goes back, but never before the start of a fixed or sliding window's
//! current window: there the engines differ, by the shape of the in-memory state (it keeps
//! the counters of the newest window it saw and the one before; Redis keeps a counter per
//! window), which only an injected clock can show.
//!
//! On a difference, the failing case is printed in the format of `tests/vectors/*.json`
//! (expectations from the in-memory engine, the Redis decisions beside them), ready to be
//! added to the vectors once the defect is fixed.

mod support;

use proptest::prelude::*;
use serde_json::{json, Value};
use shardlimit::{
    Config, Decision, Layer, Lease, Limiter, ManualClock, OnError, Policy, Reservation, Source,
    MAX_LIMIT,
};
use std::sync::Arc;
use std::time::Duration;

/// The shortest TTL (µs) any script may set in this test (see the module's comment).
const MIN_TTL_US: u64 = 30_000_000;
const KEYS: [&str; 3] = ["a", "b", "{t}c"];
const ALGORITHMS: [&str; 6] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "leaky_bucket",
    "concurrency",
];

/// A policy of a case: an algorithm, its limit, and its period (window, lease TTL, or a
/// bucket's µs per unit).
#[derive(Debug, Clone)]
struct Spec {
    algorithm: usize,
    limit: u64,
    period_us: u64,
    /// fixed and sliding windows: `"window_offset": "per_key"`
    per_key: bool,
    /// buckets: an exact rate of `.0` units per `.1` seconds whose interval is not a whole
    /// number of µs (`period_us` is then that interval rounded up, for the times only)
    fine: Option<(u64, u64)>,
}

impl Spec {
    fn is_bucket(&self) -> bool {
        matches!(ALGORITHMS[self.algorithm], "token_bucket" | "leaky_bucket")
    }

    fn per_sec(&self) -> f64 {
        match self.fine {
            Some((n, secs)) => n as f64 / secs as f64,
            None => 1e6 / self.period_us as f64,
        }
    }

    /// What the engines add to the clock for `key`'s windows (0 unless per-key offsets).
    fn shift(&self, key: &str) -> u64 {
        if !self.per_key {
            return 0;
        }
        let w = self.period_us;
        (w - shardlimit::window_offset_us(key, w)) % w
    }

    fn is_concurrency(&self) -> bool {
        ALGORITHMS[self.algorithm] == "concurrency"
    }

    /// Whether charge, refund and reserve apply (every policy but a concurrency one, which
    /// has leases: per-key window offsets and exact fractional rates too).
    fn settles(&self) -> bool {
        !self.is_concurrency()
    }

    /// The policy as a config object (the form of the vectors).
    fn json(&self) -> Value {
        let ms = format!("{}ms", self.period_us / 1000);
        match ALGORITHMS[self.algorithm] {
            a @ ("fixed_window" | "sliding_window") if self.per_key => {
                json!({"algorithm": a, "limit": self.limit, "window": ms,
                    "window_offset": "per_key"})
            }
            a @ ("fixed_window" | "sliding_window" | "sliding_log") => {
                json!({"algorithm": a, "limit": self.limit, "window": ms})
            }
            "token_bucket" => json!({"algorithm": "token_bucket", "capacity": self.limit,
                "refill_per_sec": self.per_sec()}),
            "leaky_bucket" => json!({"algorithm": "leaky_bucket", "capacity": self.limit,
                "leak_per_sec": self.per_sec()}),
            _ => json!({"algorithm": "concurrency", "max": self.limit, "lease_ttl": ms}),
        }
    }
}

/// How much time passes before a step (or, `Back`, how far the clock goes back).
#[derive(Debug, Clone)]
enum Dt {
    /// the same instant as the step before
    Zero,
    /// this many µs (1 to 1000)
    Micros(u64),
    /// this fraction (per mille) of the longest period
    Fraction(u64),
    /// to the next boundary of policy `.0`'s period, less `.1` µs (0 or 1)
    Boundary(usize, u64),
    /// back by this fraction (per mille) of the longest period
    Back(u64),
}

/// A cost, resolved against its policy's limit.
#[derive(Debug, Clone, Copy)]
enum Cost {
    One,
    Limit,
    /// the limit plus 1 or 2: can never fit
    Over(u64),
    /// 1 + this mod the limit
    Any(u64),
}

impl Cost {
    fn of(self, limit: u64) -> u64 {
        match self {
            Cost::One => 1,
            Cost::Limit => limit,
            Cost::Over(n) => limit + n,
            Cost::Any(n) => 1 + n % limit,
        }
    }
}

#[derive(Debug, Clone)]
enum Item {
    Check(usize, usize, Cost),
    Peek(usize, usize),
    /// a lease on a concurrency policy (a check on any other)
    Acquire(usize, usize, Cost),
}

#[derive(Debug, Clone)]
enum Op {
    One(Item),
    /// the n-th lease taken so far (mod their number)
    Release(usize),
    Reset(usize, usize),
    /// layers (policy, key, cost); duplicates of a (policy, key) are dropped
    CheckAll(Vec<(usize, usize, Cost)>),
    /// checks issued together (Redis: batch script calls)
    Burst(Vec<Item>),
    /// a check in shadow mode for this call (`check_shadow`; its own script call, so never
    /// in a burst, whose order it would not keep); a lease on a concurrency policy
    Shadow(usize, usize, Cost),
    /// charge, refund or reserve (policy, key, cost); nothing on a concurrency policy
    Charge(usize, usize, Cost),
    Refund(usize, usize, Cost),
    Reserve(usize, usize, Cost),
    /// settles the n-th reservation still held (mod their number) at this actual cost
    /// (`Cost::of` its units: 0 when `Over(2)`, to give everything back)
    Settle(usize, Cost),
}

/// How the Redis side makes a single call.
#[derive(Debug, Clone, Copy)]
enum Via {
    Async,
    Blocking,
}

#[derive(Debug, Clone)]
struct Case {
    policies: Vec<Spec>,
    t0: u64,
    steps: Vec<(Dt, Op, Via)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    let limit = prop_oneof![
        6 => 1u64..=12,
        1 => 13u64..=1000,
        1 => Just(1_000_000u64),
        1 => Just(MAX_LIMIT),
    ];
    let fine = prop_oneof![2 => Just(None), 1 => (0usize..5, 1u64..=20).prop_map(Some)];
    (0..ALGORITHMS.len(), limit, 0u64..=600, any::<bool>(), fine).prop_map(
        |(algorithm, limit, p, per_key, fine)| {
            // periods from MIN_TTL_US to 20 times that, on whole ms (windows must be)
            let period_us = (MIN_TTL_US + p * MIN_TTL_US * 19 / 600) / 1000 * 1000;
            let mut s = Spec {
                algorithm,
                limit,
                period_us,
                per_key: false,
                fine: None,
            };
            if matches!(ALGORITHMS[algorithm], "fixed_window" | "sliding_window") && per_key {
                s.per_key = true;
            }
            if s.is_bucket() {
                // a whole number of µs per unit that 1e6 / rate gives back exactly, and a
                // capacity that refills within the longest span a bucket may have
                s.period_us += p * 7 + 1;
                s.limit = s.limit.min(1_000_000);
                if let Some((k, m)) = fine {
                    // n units per `secs` seconds, n prime to 10: an interval of secs·1e6/n µs,
                    // never whole, at least MIN_TTL_US; a capacity whose full bucket in
                    // ticks of 1/n µs stays exact in the scripts' doubles
                    let n = [3u64, 7, 9, 11, 13][k];
                    let secs = n * 30 * m + 1;
                    s.fine = Some((n, secs));
                    s.period_us = (secs * 1_000_000).div_ceil(n);
                    s.limit = s.limit.min(100_000);
                }
            }
            s
        },
    )
}

fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        3 => Just(Cost::One),
        1 => Just(Cost::Limit),
        1 => (1u64..=2).prop_map(Cost::Over),
        3 => any::<u64>().prop_map(Cost::Any),
    ]
}

fn item(np: usize) -> impl Strategy<Value = Item> {
    prop_oneof![
        3 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Item::Check(p, k, c)),
        1 => (0..np, 0..KEYS.len()).prop_map(|(p, k)| Item::Peek(p, k)),
        2 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Item::Acquire(p, k, c)),
    ]
}

fn op(np: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => item(np).prop_map(Op::One),
        2 => (0usize..8).prop_map(Op::Release),
        1 => (0..np, 0..KEYS.len()).prop_map(|(p, k)| Op::Reset(p, k)),
        2 => prop::collection::vec((0..np, 0..KEYS.len(), cost()), 1..=3).prop_map(Op::CheckAll),
        2 => prop::collection::vec(item(np), 2..=6).prop_map(Op::Burst),
        2 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Op::Shadow(p, k, c)),
        2 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Op::Charge(p, k, c)),
        1 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Op::Refund(p, k, c)),
        2 => (0..np, 0..KEYS.len(), cost()).prop_map(|(p, k, c)| Op::Reserve(p, k, c)),
        2 => (0usize..8, cost()).prop_map(|(n, c)| Op::Settle(n, c)),
    ]
}

fn dt(np: usize) -> impl Strategy<Value = Dt> {
    prop_oneof![
        4 => Just(Dt::Zero),
        1 => (1u64..=1000).prop_map(Dt::Micros),
        3 => (1u64..=1500).prop_map(Dt::Fraction),
        2 => (0..np, 0u64..=1).prop_map(|(p, b)| Dt::Boundary(p, b)),
        1 => (1u64..=500).prop_map(Dt::Back),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(spec(), 1..=3).prop_flat_map(|mut policies| {
        // one window for every fixed window of a case: then moving a time out of the end
        // of one window (see the module's comment) cannot put it at the end of another
        if let Some(w) = policies
            .iter()
            .find(|s| ALGORITHMS[s.algorithm] == "fixed_window")
            .map(|s| s.period_us)
        {
            // with per-key offsets the keys' windows end at up to 1 + KEYS.len() instants
            // per window: long enough windows leave a time at least MIN_TTL_US before each
            let w = if policies
                .iter()
                .any(|s| ALGORITHMS[s.algorithm] == "fixed_window" && s.per_key)
            {
                w.max((KEYS.len() as u64 + 2) * MIN_TTL_US)
            } else {
                w
            };
            for s in policies.iter_mut() {
                if ALGORITHMS[s.algorithm] == "fixed_window" {
                    s.period_us = w;
                }
            }
        }
        let np = policies.len();
        (
            Just(policies),
            1_700_000_000_000_000u64..1_900_000_000_000_000,
            prop::collection::vec(
                (
                    dt(np),
                    op(np),
                    prop_oneof![Just(Via::Async), Just(Via::Blocking)],
                ),
                1..40,
            ),
        )
            .prop_map(|(policies, t0, steps)| Case {
                policies,
                t0,
                steps,
            })
    })
}

/// What both engines must agree on, for one call.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Decision(Value),
    Released(bool),
    Reset,
    /// a release with no lease taken yet
    Nothing,
}

/// Every field of a decision but who made it (compared apart: memory or redis).
fn fields(d: &Decision) -> Value {
    json!({
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after_us": d.reset_after.as_micros() as u64,
        "retry_after_us": d.retry_after.map(|r| r.as_micros() as u64),
        "delay_us": d.delay.as_micros() as u64,
        "policy": &*d.policy,
        "layer": d.layer,
        "window_us": d.window.as_micros() as u64,
        "shadow_denied": d.shadow_denied,
    })
}

/// The vectors' `expect`: the fields above but `window_us`.
fn expect_of(v: &Value) -> Value {
    let mut v = v.clone();
    let o = v.as_object_mut().unwrap();
    o.remove("window_us");
    // as tests/vectors/shadow.json writes it: only when true
    if o.get("shadow_denied") == Some(&Value::Bool(false)) {
        o.remove("shadow_denied");
    }
    v
}

struct Engines {
    server: support::RedisServer,
    redis: Limiter,
    redis_clock: Arc<ManualClock>,
    spawner: shardlimit::Spawner,
}

impl Engines {
    fn start() -> Engines {
        let server = support::RedisServer::start();
        let redis_clock = ManualClock::new(1_800_000_000_000_000);
        let redis = Limiter::from_json(&support::config(&[&server], "{}"))
            .unwrap()
            .with_clock(redis_clock.clone())
            .unwrap();
        let spawner = redis.spawner().unwrap().expect("a Redis limiter");
        let engines = Engines {
            server,
            redis,
            redis_clock,
            spawner,
        };
        engines.warm_up();
        engines
    }

    /// Connects and loads every check script, single and batch, so that no burst of the
    /// test waits for a connection or sees NOSCRIPT (the counts of script calls stay exact).
    fn warm_up(&self) {
        for (i, a) in ALGORITHMS.iter().enumerate() {
            let s = Spec {
                algorithm: i,
                limit: 2,
                period_us: MIN_TTL_US + 7,
                per_key: false,
                fine: None,
            };
            let p = policy(&format!("warm_{a}"), &s);
            self.redis.peek_blocking("warm", &p).unwrap();
            let (tx, rx) = std::sync::mpsc::channel::<Vec<shardlimit::Result<Decision>>>();
            let l = self.redis.clone();
            self.spawner.spawn(async move {
                let futs: Vec<_> = (0..2)
                    .map(|_| {
                        let (l, p) = (l.clone(), p.clone());
                        Box::pin(async move { l.peek("warm", &p).await }) as BoxFut<_>
                    })
                    .collect();
                let _ = tx.send(in_order(futs).await);
            });
            for r in rx.recv_timeout(Duration::from_secs(10)).unwrap() {
                r.unwrap();
            }
        }
        redis::cmd("FLUSHALL")
            .exec(&mut self.server.conn())
            .unwrap();
    }

    /// EVALSHA and EVAL calls the server has run so far.
    fn script_calls(&self) -> u64 {
        self.server.script_calls()
    }
}

use support::{in_order, BoxFut};

fn policy(name: &str, s: &Spec) -> Policy {
    let cfg = Config::from_value(&json!({ "policies": { name: s.json() } })).unwrap();
    // a failed call must fail the test, never pass as a fallback decision
    cfg.policies[name].with_on_error(OnError::Error)
}

/// One side's state during a case.
struct Side<'a> {
    limiter: &'a Limiter,
    clock: &'a ManualClock,
    leases: Vec<Option<Lease>>,
    source: Source,
    /// reservations not settled yet, oldest first
    reservations: Vec<Reservation>,
}

type CallResult = shardlimit::Result<(Decision, Option<Lease>)>;

fn call_async(l: &Limiter, it: &Item, policies: &[Policy], specs: &[Spec]) -> CallResult {
    let fut = item_future(l, it, policies, specs);
    l.block_on(fut)
}

fn item_future(l: &Limiter, it: &Item, policies: &[Policy], specs: &[Spec]) -> BoxFut<CallResult> {
    let l = l.clone();
    match *it {
        // a check of a concurrency policy is an error (no lease could give it back): the
        // nearest operation is a lease never released, which holds until it expires
        Item::Check(p, k, c) if specs[p].is_concurrency() => {
            let (pol, cost) = (policies[p].clone(), c.of(specs[p].limit));
            Box::pin(async move { l.acquire(KEYS[k], &pol, cost).await.map(|(d, _)| (d, None)) })
        }
        Item::Check(p, k, c) => {
            let (pol, cost) = (policies[p].clone(), c.of(specs[p].limit));
            Box::pin(async move { l.check(KEYS[k], &pol, cost).await.map(|d| (d, None)) })
        }
        Item::Peek(p, k) => {
            let pol = policies[p].clone();
            Box::pin(async move { l.peek(KEYS[k], &pol).await.map(|d| (d, None)) })
        }
        Item::Acquire(p, k, c) => {
            let (pol, cost) = (policies[p].clone(), c.of(specs[p].limit));
            if specs[p].is_concurrency() {
                Box::pin(async move { l.acquire(KEYS[k], &pol, cost).await })
            } else {
                Box::pin(async move { l.check(KEYS[k], &pol, cost).await.map(|d| (d, None)) })
            }
        }
    }
}

fn call_blocking(l: &Limiter, it: &Item, policies: &[Policy], specs: &[Spec]) -> CallResult {
    match *it {
        Item::Check(p, k, c) if specs[p].is_concurrency() => l
            .acquire_blocking(KEYS[k], &policies[p], c.of(specs[p].limit))
            .map(|(d, _)| (d, None)),
        Item::Check(p, k, c) => l
            .check_blocking(KEYS[k], &policies[p], c.of(specs[p].limit))
            .map(|d| (d, None)),
        Item::Peek(p, k) => l.peek_blocking(KEYS[k], &policies[p]).map(|d| (d, None)),
        Item::Acquire(p, k, c) if specs[p].is_concurrency() => {
            l.acquire_blocking(KEYS[k], &policies[p], c.of(specs[p].limit))
        }
        Item::Acquire(p, k, c) => l
            .check_blocking(KEYS[k], &policies[p], c.of(specs[p].limit))
            .map(|d| (d, None)),
    }
}

/// The layers of a layered check: a concurrency policy's are left out (a layered check of
/// one is an error on both engines, `core/tests/layered_concurrency.rs`).
fn layers_of(raw: &[(usize, usize, Cost)], policies: &[Policy], specs: &[Spec]) -> Vec<Layer> {
    let mut seen = Vec::new();
    let mut layers = Vec::new();
    for &(p, k, c) in raw {
        if !seen.contains(&(p, k)) && !specs[p].is_concurrency() {
            seen.push((p, k));
            layers.push(Layer::new(KEYS[k], &policies[p], c.of(specs[p].limit)));
        }
    }
    layers
}

impl Side<'_> {
    fn decided(&mut self, r: CallResult, what: &str) -> Result<Got, String> {
        let (d, lease) = r.map_err(|e| format!("{what}: {e}"))?;
        if d.source != self.source {
            return Err(format!("{what}: decided by {:?}: {d:?}", d.source));
        }
        if d.allowed {
            if let Some(lease) = lease {
                self.leases.push(Some(lease));
            }
        }
        Ok(Got::Decision(fields(&d)))
    }
}

/// Runs `case` on both engines, step by step. `Ok`: every result was the same on both,
/// with the results (the memory engine's) for each step; `Err`: the first difference,
/// with the case as a vector.
fn run(e: &Engines, case: &Case) -> Result<Vec<Vec<Got>>, String> {
    redis::cmd("FLUSHALL").exec(&mut e.server.conn()).unwrap();
    let policies: Vec<Policy> = case
        .policies
        .iter()
        .enumerate()
        .map(|(i, s)| policy(&format!("p{i}"), s))
        .collect();
    let specs = &case.policies;
    let mem_clock = ManualClock::new(case.t0);
    let memory = Limiter::memory().with_clock(mem_clock.clone()).unwrap();
    let mut mem = Side {
        limiter: &memory,
        clock: &mem_clock,
        leases: Vec::new(),
        source: Source::Memory,
        reservations: Vec::new(),
    };
    let mut red = Side {
        limiter: &e.redis,
        clock: &e.redis_clock,
        leases: Vec::new(),
        source: Source::Redis,
        reservations: Vec::new(),
    };
    let times = times(case);
    let mut all = Vec::new();
    for (i, ((_, op, via), t)) in case.steps.iter().zip(&times).enumerate() {
        mem.clock.set_us(*t);
        red.clock.set_us(*t);
        let what = format!("step {i} ({op:?} via {via:?})");
        let fail = |m: &Vec<Got>, r: &Vec<Got>| {
            let mut all = all.clone();
            all.push(m.clone());
            let vector = serde_json::to_string_pretty(&vector_case(case, &times, &all, i)).unwrap();
            format!(
                "{what}: memory and Redis differ\n memory: {m:?}\n redis:  {r:?}\n\
                 the case up to this step, as a vector (expectations from memory):\n{vector}"
            )
        };
        let (m, r): (Vec<Got>, Vec<Got>) = match op {
            Op::One(it) => {
                let m = mem.decided(call_blocking(mem.limiter, it, &policies, specs), &what)?;
                let r = match via {
                    Via::Async => call_async(red.limiter, it, &policies, specs),
                    Via::Blocking => call_blocking(red.limiter, it, &policies, specs),
                };
                let r = red.decided(r, &what)?;
                (vec![m], vec![r])
            }
            Op::Release(n) => {
                let mut got = Vec::new();
                for side in [&mut mem, &mut red] {
                    if side.leases.is_empty() {
                        got.push(Got::Nothing);
                        continue;
                    }
                    let lease = side.leases[n % side.leases.len()].clone().unwrap();
                    // (ad-hoc policies, not in the config: release_with)
                    let pol = policies.iter().find(|p| p.name() == lease.policy).unwrap();
                    let l = side.limiter;
                    let released = match via {
                        Via::Blocking => l.release_with_blocking(pol, &lease),
                        Via::Async => {
                            let (l2, pol) = (l.clone(), pol.clone());
                            l.block_on(async move { l2.release_with(&pol, &lease).await })
                        }
                    };
                    got.push(Got::Released(released.map_err(|e| format!("{what}: {e}"))?));
                }
                let r = got.pop().unwrap();
                (got, vec![r])
            }
            Op::Reset(p, k) => {
                memory.reset_blocking(KEYS[*k], &policies[*p]).unwrap();
                let r = match via {
                    Via::Blocking => e.redis.reset_blocking(KEYS[*k], &policies[*p]),
                    Via::Async => {
                        let (l, pol, key) = (e.redis.clone(), policies[*p].clone(), KEYS[*k]);
                        e.redis.block_on(async move { l.reset(key, &pol).await })
                    }
                };
                r.map_err(|e| format!("{what}: {e}"))?;
                (vec![Got::Reset], vec![Got::Reset])
            }
            Op::Shadow(p, k, c) => {
                let it = Item::Check(*p, *k, *c);
                let shadow = |l: &Limiter| {
                    if specs[*p].is_concurrency() {
                        return call_blocking(l, &it, &policies, specs);
                    }
                    l.check_shadow_blocking(KEYS[*k], &policies[*p], c.of(specs[*p].limit))
                        .map(|d| (d, None))
                };
                let m = mem.decided(shadow(mem.limiter), &what)?;
                let r = match via {
                    Via::Blocking => shadow(red.limiter),
                    Via::Async if specs[*p].is_concurrency() => {
                        call_async(red.limiter, &it, &policies, specs)
                    }
                    Via::Async => {
                        let (l, pol, cost, key) = (
                            red.limiter.clone(),
                            policies[*p].clone(),
                            c.of(specs[*p].limit),
                            KEYS[*k],
                        );
                        red.limiter.block_on(async move {
                            l.check_shadow(key, &pol, cost).await.map(|d| (d, None))
                        })
                    }
                };
                let r = red.decided(r, &what)?;
                (vec![m], vec![r])
            }
            Op::CheckAll(raw) if layers_of(raw, &policies, specs).is_empty() => {
                (vec![Got::Nothing], vec![Got::Nothing])
            }
            Op::CheckAll(raw) => {
                let layers = layers_of(raw, &policies, specs);
                let m = memory.check_all_blocking(&layers).map(|d| (d, None));
                let m = mem.decided(m, &what)?;
                let r = match via {
                    Via::Blocking => e.redis.check_all_blocking(&layers),
                    Via::Async => {
                        let l = e.redis.clone();
                        e.redis.block_on(async move { l.check_all(&layers).await })
                    }
                };
                let r = red.decided(r.map(|d| (d, None)), &what)?;
                (vec![m], vec![r])
            }
            Op::Burst(items) => {
                let mut m = Vec::new();
                for it in items {
                    let got =
                        mem.decided(call_blocking(mem.limiter, it, &policies, specs), &what)?;
                    m.push(got);
                }
                let futs: Vec<BoxFut<CallResult>> = items
                    .iter()
                    .map(|it| item_future(&e.redis, it, &policies, specs))
                    .collect();
                let before = e.script_calls();
                let (tx, rx) = std::sync::mpsc::channel();
                e.spawner.spawn(async move {
                    let _ = tx.send(in_order(futs).await);
                });
                let results = rx
                    .recv_timeout(Duration::from_secs(10))
                    .map_err(|_| format!("{what}: the burst did not finish in 10 s"))?;
                // one batch call per algorithm (the single script when one check has it)
                let mut algorithms: Vec<usize> = items
                    .iter()
                    .map(|it| match *it {
                        Item::Check(p, ..) | Item::Peek(p, _) | Item::Acquire(p, ..) => {
                            specs[p].algorithm
                        }
                    })
                    .collect();
                algorithms.sort_unstable();
                algorithms.dedup();
                let calls = e.script_calls() - before;
                if calls != algorithms.len() as u64 {
                    return Err(format!(
                        "{what}: {calls} script calls for a burst of {} checks of {} algorithms",
                        items.len(),
                        algorithms.len()
                    ));
                }
                let mut r = Vec::new();
                for res in results {
                    r.push(red.decided(res, &what)?);
                }
                (m, r)
            }
            Op::Charge(p, k, c) | Op::Refund(p, k, c) | Op::Reserve(p, k, c)
                if specs[*p].settles() =>
            {
                let cost = c.of(specs[*p].limit);
                let mut got = Vec::new();
                for side in [&mut mem, &mut red] {
                    let (l, pol, key) = (side.limiter.clone(), policies[*p].clone(), KEYS[*k]);
                    let blocking = matches!(via, Via::Blocking) || side.source == Source::Memory;
                    let r = match (op, blocking) {
                        (Op::Charge(..), true) => {
                            l.charge_blocking(key, &pol, cost).map(|d| (d, None))
                        }
                        (Op::Refund(..), true) => {
                            l.refund_blocking(key, &pol, cost).map(|d| (d, None))
                        }
                        (_, true) => l.reserve_blocking(key, &pol, cost),
                        (Op::Charge(..), false) => side.limiter.block_on(async move {
                            l.charge(key, &pol, cost).await.map(|d| (d, None))
                        }),
                        (Op::Refund(..), false) => side.limiter.block_on(async move {
                            l.refund(key, &pol, cost).await.map(|d| (d, None))
                        }),
                        (_, false) => side
                            .limiter
                            .block_on(async move { l.reserve(key, &pol, cost).await }),
                    };
                    let (d, reservation) = r.map_err(|e| format!("{what}: {e}"))?;
                    if d.source != side.source {
                        return Err(format!("{what}: decided by {:?}: {d:?}", d.source));
                    }
                    side.reservations.extend(reservation);
                    got.push(Got::Decision(fields(&d)));
                }
                let r = got.pop().unwrap();
                (got, vec![r])
            }
            Op::Charge(..) | Op::Refund(..) | Op::Reserve(..) => {
                (vec![Got::Nothing], vec![Got::Nothing])
            }
            Op::Settle(n, c) => {
                let mut got = Vec::new();
                for side in [&mut mem, &mut red] {
                    if side.reservations.is_empty() {
                        got.push(Got::Nothing);
                        continue;
                    }
                    let r = side.reservations.remove(n % side.reservations.len());
                    let actual = match c {
                        Cost::Over(2) => 0,
                        c => c.of(r.units),
                    };
                    let pol = policies.iter().find(|p| p.name() == r.policy).unwrap();
                    let l = side.limiter.clone();
                    let d = match via {
                        Via::Blocking => l.settle_with_blocking(pol, &r, actual),
                        Via::Async => {
                            let pol = pol.clone();
                            side.limiter
                                .block_on(async move { l.settle_with(&pol, &r, actual).await })
                        }
                    };
                    let d = d.map_err(|e| format!("{what}: {e}"))?;
                    got.push(Got::Decision(fields(&d)));
                }
                let r = got.pop().unwrap();
                (got, vec![r])
            }
        };
        if m != r {
            return Err(fail(&m, &r));
        }
        all.push(m);
    }
    Ok(all)
}

/// The time of every step of `case`.
fn times(case: &Case) -> Vec<u64> {
    let longest = case.policies.iter().map(|s| s.period_us).max().unwrap();
    // (window, shift) of every fixed window's keys, and of every fixed or sliding one's
    let shifted = |algorithms: &[&str]| -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = case
            .policies
            .iter()
            .filter(|s| algorithms.contains(&ALGORITHMS[s.algorithm]))
            .flat_map(|s| KEYS.iter().map(move |k| (s.period_us, s.shift(k))))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let fw = shifted(&["fixed_window"]);
    let windows = shifted(&["fixed_window", "sliding_window"]);
    let mut t = case.t0;
    let mut out = Vec::new();
    for (dt, ..) in &case.steps {
        if let Dt::Back(n) = *dt {
            // not before the start of a fixed or sliding window's current window: the
            // in-memory engine keeps the counters of the newest window only (see the
            // module's comment)
            let start = windows
                .iter()
                .map(|(w, sh)| ((t + sh) / w * w).saturating_sub(*sh))
                .max()
                .unwrap_or(0);
            t = t.saturating_sub(longest * n / 1000).max(start);
        }
        t += match *dt {
            Dt::Back(_) => 0,
            Dt::Zero => 0,
            Dt::Micros(n) => n,
            Dt::Fraction(n) => longest * n / 1000,
            Dt::Boundary(p, before) => {
                // (the first key's boundary, for windows placed per key)
                let period = case.policies[p].period_us;
                let sh = case.policies[p].shift(KEYS[0]);
                let next = ((t + sh) / period + 1) * period - sh - before;
                next.saturating_sub(t)
            }
        };
        // never within MIN_TTL_US of a fixed window's end (any key's): on to its boundary,
        // until no key's window ends that soon (each move lands on a boundary, and the
        // windows are long enough for a time that is far from all of them)
        for _ in 0..=fw.len() {
            let Some(left) = fw
                .iter()
                .map(|(w, sh)| w - (t + sh) % w)
                .find(|left| *left < MIN_TTL_US)
            else {
                break;
            };
            t += left;
        }
        assert!(
            fw.iter().all(|(w, sh)| w - (t + sh) % w >= MIN_TTL_US),
            "a time far from every fixed window's end"
        );
        out.push(t);
    }
    out
}

/// The steps of `case` up to `upto` in the vectors' format, with the memory engine's results
/// (`got`) as expectations, and the policies they use.
fn vector_case(case: &Case, times: &[u64], got: &[Vec<Got>], upto: usize) -> Value {
    let specs = &case.policies;
    let policies: serde_json::Map<String, Value> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("p{i}"), s.json()))
        .collect();
    let mut leases = 0usize;
    let (mut reservations, mut settled) = (0usize, Vec::<usize>::new());
    let mut steps = Vec::new();
    for (i, ((_, op, _), t)) in case.steps.iter().zip(times).enumerate().take(upto + 1) {
        let results = got.get(i);
        let expect = |j: usize| match results.and_then(|r| r.get(j)) {
            Some(Got::Decision(v)) => expect_of(v),
            _ => Value::Null,
        };
        let item = |it: &Item, j: usize, leases: &mut usize| -> Value {
            match *it {
                Item::Check(p, k, c) if specs[p].is_concurrency() => json!({"op": "acquire",
                    "key": KEYS[k], "policy": format!("p{p}"), "units": c.of(specs[p].limit),
                    "expect": expect(j)}),
                Item::Check(p, k, c) => json!({"op": "check", "key": KEYS[k],
                    "policy": format!("p{p}"), "cost": c.of(specs[p].limit), "expect": expect(j)}),
                Item::Peek(p, k) => json!({"op": "peek", "key": KEYS[k],
                    "policy": format!("p{p}"), "expect": expect(j)}),
                Item::Acquire(p, k, c) if specs[p].is_concurrency() => {
                    let e = expect(j);
                    let mut v = json!({"op": "acquire", "key": KEYS[k], "policy": format!("p{p}"),
                        "units": c.of(specs[p].limit), "expect": e});
                    if e["allowed"] == true {
                        v["lease_as"] = json!(format!("l{leases}"));
                        *leases += 1;
                    }
                    v
                }
                Item::Acquire(p, k, c) => json!({"op": "check", "key": KEYS[k],
                    "policy": format!("p{p}"), "cost": c.of(specs[p].limit), "expect": expect(j)}),
            }
        };
        let step = match op {
            Op::One(it) => item(it, 0, &mut leases),
            Op::Release(n) if leases > 0 => json!({"op": "release",
                "lease": format!("l{}", n % leases),
                "expect_released": matches!(results.and_then(|r| r.first()), Some(Got::Released(true)))}),
            Op::Release(_) => continue,
            Op::Reset(p, k) => json!({"op": "reset", "key": KEYS[*k], "policy": format!("p{p}")}),
            Op::Shadow(p, k, c) => {
                let mut v = item(&Item::Check(*p, *k, *c), 0, &mut leases);
                if !specs[*p].is_concurrency() {
                    v["shadow"] = json!(true);
                }
                v
            }
            Op::CheckAll(raw) => {
                let mut seen = Vec::new();
                let mut layers = Vec::new();
                for &(p, k, c) in raw {
                    if !seen.contains(&(p, k)) && !specs[p].is_concurrency() {
                        seen.push((p, k));
                        layers.push(json!({"key": KEYS[k], "policy": format!("p{p}"),
                            "cost": c.of(specs[p].limit)}));
                    }
                }
                if layers.is_empty() {
                    continue; // only concurrency layers: not run
                }
                json!({"op": "check_all", "layers": layers, "expect": expect(0)})
            }
            Op::Burst(items) => {
                let items: Vec<Value> = items
                    .iter()
                    .enumerate()
                    .map(|(j, it)| item(it, j, &mut leases))
                    .collect();
                json!({"op": "batch", "items": items})
            }
            Op::Charge(p, k, c) | Op::Refund(p, k, c) | Op::Reserve(p, k, c)
                if specs[*p].settles() =>
            {
                let name = match op {
                    Op::Charge(..) => "charge",
                    Op::Refund(..) => "refund",
                    _ => "reserve",
                };
                let e = expect(0);
                let mut v = json!({"op": name, "key": KEYS[*k], "policy": format!("p{p}"),
                    "cost": c.of(specs[*p].limit), "expect": e});
                if name == "reserve" && e["allowed"] == true {
                    v["reserve_as"] = json!(format!("r{reservations}"));
                    reservations += 1;
                }
                v
            }
            Op::Settle(n, c) if reservations > settled.len() => {
                // the n-th of those not settled yet, as run() picks it
                let open: Vec<usize> = (0..reservations).filter(|r| !settled.contains(r)).collect();
                let r = open[n % open.len()];
                settled.push(r);
                let actual = match c {
                    Cost::Over(2) => Value::from(0),
                    c => Value::from(format!("{c:?} of the reservation's units")),
                };
                json!({"op": "settle", "reservation": format!("r{r}"), "actual": actual,
                    "expect": expect(0)})
            }
            _ => Value::Null,
        };
        // (settle.json's ops; a reservation is named by its place among those made)
        let mut step = step;
        if step.is_null() {
            continue;
        }
        step["t_us"] = json!(t);
        steps.push(step);
    }
    let used = |name: &str| {
        let quoted = Value::from(name);
        steps.iter().any(|s| {
            serde_json::to_string(s)
                .unwrap()
                .contains(&format!("\"policy\":{quoted}"))
        })
    };
    let policies: serde_json::Map<String, Value> =
        policies.into_iter().filter(|(n, _)| used(n)).collect();
    json!({"name": "differential: (name it)", "policies": policies, "steps": steps})
}

/// `CASES` random cases (`PROPTEST_CASES` to change), the same on every run (seed fixed;
/// `PROPTEST_RNG_SEED` to explore others). A failure is shrunk and its seed recorded in
/// `differential.proptest-regressions` (committed), which is replayed first on every run.
#[test]
fn memory_and_redis_engines_agree_on_random_sequences() {
    const CASES: u32 = 512;
    let engines = Engines::start();
    let started = std::time::Instant::now();
    let mut config = ProptestConfig {
        max_shrink_iters: 500,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"),
        )),
        source_file: Some(file!()),
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = CASES;
    }
    if matches!(config.rng_seed, proptest::test_runner::RngSeed::Random) {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x5eed_d1ff);
    }
    let cases = config.cases;
    let steps = std::sync::atomic::AtomicUsize::new(0);
    // cases with a per-key window offset, with an exact fractional bucket rate
    let (per_key, fine) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let result = runner.run(&case(), |c| {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        if c.policies.iter().any(|s| s.per_key) {
            per_key.fetch_add(1, relaxed);
        }
        if c.policies.iter().any(|s| s.fine.is_some()) {
            fine.fetch_add(1, relaxed);
        }
        let got = run(&engines, &c).map_err(TestCaseError::fail)?;
        steps.fetch_add(
            got.iter().map(Vec::len).sum(),
            std::sync::atomic::Ordering::Relaxed,
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (per_key, fine) = (per_key.into_inner(), fine.into_inner());
    eprintln!(
        "{cases} random cases ({per_key} with per-key window offsets, {fine} with exact \
         fractional rates), {} calls on each engine, in {:?}",
        steps.into_inner(),
        started.elapsed()
    );
    assert!(
        per_key >= cases as usize / 8 && fine >= cases as usize / 16,
        "the generator covers offsets and fine rates"
    );
}
