//! Charge, refund and reserve-and-settle on both engines with an
//! injected clock: debt and its exact `retry_after`, refunds that never exceed the limit,
//! settles that give back to the window that admitted, and exact books under 64
//! concurrent callers on a real Redis.

mod support;

use shardlimit::{Decision, ErrorKind, Limit, Limiter, ManualClock, Policy, Source};
use std::sync::Arc;
use std::time::Duration;
use support::RedisServer;

/// A window start (µs): 1s windows begin here.
const T0: u64 = 1_800_000_000_000_000;
const SEC: u64 = 1_000_000;

fn engines(server: &RedisServer) -> Vec<(&'static str, Limiter, Arc<ManualClock>)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    let redis = Limiter::from_json(&support::config(&[server], "{}")).unwrap();
    let mut out = Vec::new();
    for (name, l) in [("redis", redis), ("memory", Limiter::memory())] {
        let c = ManualClock::new(T0);
        out.push((name, l.with_clock(c.clone()).unwrap(), c));
    }
    out
}

/// The five algorithms charge and refund apply to, each with 10 units per second.
fn policies() -> Vec<Policy> {
    let s = Duration::from_secs(1);
    [
        ("fw", Limit::fixed_window(10, s)),
        ("sw", Limit::sliding_window(10, s)),
        ("sl", Limit::sliding_log(10, s)),
        ("tb", Limit::token_bucket(10, 10.0)),
        ("lb", Limit::leaky_bucket(10, 10.0)),
    ]
    .into_iter()
    .map(|(n, l)| Policy::new(n, l).unwrap())
    .collect()
}

/// 64 threads at once on one key of `p`, each reserving 10 units, settling at 0..=16
/// (refunds and excess charges), then charging 3 and refunding 1: the units they used in
/// all.
fn sixty_four_settlers(l: &Limiter, p: &Policy) -> u64 {
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let (l, p) = (l.clone(), p.clone());
            std::thread::spawn(move || -> u64 {
                let (d, r) = l.reserve_blocking("hot", &p, 10).unwrap();
                assert!(d.allowed);
                let actual = i % 17;
                l.settle_with_blocking(&p, &r.unwrap(), actual).unwrap();
                l.charge_blocking("hot", &p, 3).unwrap();
                l.refund_blocking("hot", &p, 1).unwrap();
                actual + 3 - 1
            })
        })
        .collect();
    tasks.into_iter().map(|t| t.join().unwrap()).sum()
}

fn us(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_micros() as u64)
}

/// A decision without its source and shard (which differ between engines).
type Shape = (bool, u64, u64, Option<u64>, u64);

fn shape(d: &Decision) -> Shape {
    (
        d.allowed,
        d.remaining,
        d.reset_after.as_micros() as u64,
        us(d.retry_after),
        d.delay.as_micros() as u64,
    )
}

#[test]
fn a_key_in_debt_is_denied_with_an_exact_retry_after_on_every_algorithm() {
    let server = RedisServer::start();
    let mut seen: Vec<Vec<Shape>> = Vec::new();
    for (engine, l, clock) in engines(&server) {
        let mut trace = Vec::new();
        for p in policies() {
            let at = format!("{engine}, {}", p.name());
            clock.set_us(T0 + 250_000);
            let d = l.charge_blocking("k", &p, 15).unwrap();
            assert!(d.allowed, "{at}: a charge never denies: {d:?}");
            assert_eq!(d.remaining, 0, "{at}: in debt");
            assert!(d.retry_after.is_none(), "{at}");
            let denied = l.check_blocking("k", &p, 1).unwrap();
            assert!(!denied.allowed, "{at}: {denied:?}");
            let retry = us(denied.retry_after).unwrap_or_else(|| panic!("{at}: no retry"));
            let want = match p.name() {
                // the window's end
                "fw" => 750_000,
                // this window's 15 units weigh 15 * (1 - x) in the next one: 1 unit fits
                // at x = 0.4, 0.75 s + 0.4 s from now
                "sw" => 1_150_000,
                // the one entry of 15 units expires 1 s after it was recorded
                "sl" => 1_000_000,
                // 15 units in a bucket of 10 at 10/s: 1 more fits after 0.6 s
                "tb" | "lb" => 600_000,
                _ => unreachable!(),
            };
            assert_eq!(retry, want, "{at}: {denied:?}");
            // exact: one µs earlier it is still denied, at retry_after it is admitted
            clock.set_us(T0 + 250_000 + retry - 1);
            let early = l.check_blocking("k", &p, 1).unwrap();
            assert!(!early.allowed, "{at}: admitted 1 µs before retry_after");
            assert_eq!(us(early.retry_after), Some(1), "{at}: {early:?}");
            clock.set_us(T0 + 250_000 + retry);
            let d = l.check_blocking("k", &p, 1).unwrap();
            assert!(d.allowed, "{at}: denied at retry_after: {d:?}");
            trace.extend([shape(&denied), shape(&early), shape(&d)]);
            l.reset_blocking("k", &p).unwrap();
        }
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1], "Redis and memory decide alike");
}

#[test]
fn debt_is_capped_at_one_limit() {
    let server = RedisServer::start();
    for (engine, l, clock) in engines(&server) {
        for p in policies() {
            let at = format!("{engine}, {}", p.name());
            clock.set_us(T0);
            l.charge_blocking("k", &p, 1_000_000).unwrap();
            let d = l.check_blocking("k", &p, 1).unwrap();
            let retry = us(d.retry_after).unwrap();
            // at most twice the limit is held: repaid within about two periods
            assert!(retry <= 2 * SEC + 100_000, "{at}: {d:?}");
            // and a refund of one limit takes exactly that back
            l.refund_blocking("k", &p, 10).unwrap();
            let after = l.peek_blocking("k", &p).unwrap();
            if p.name() != "sl" && p.name() != "sw" {
                assert_eq!(after.remaining, 0, "{at}: {after:?}");
            }
            l.refund_blocking("k", &p, 10).unwrap();
            let full = l.peek_blocking("k", &p).unwrap();
            assert_eq!(full.remaining, 10, "{at}: 20 units back empty it: {full:?}");
            l.reset_blocking("k", &p).unwrap();
        }
    }
}

#[test]
fn a_refund_never_goes_above_the_limit() {
    let server = RedisServer::start();
    for (engine, l, clock) in engines(&server) {
        for p in policies() {
            let at = format!("{engine}, {}", p.name());
            clock.set_us(T0 + 100_000);
            let d = l.refund_blocking("fresh", &p, 5).unwrap();
            assert_eq!(d.remaining, 10, "{at}: a full budget stays full: {d:?}");
            assert!(l.check_blocking("k", &p, 4).unwrap().allowed);
            let d = l.refund_blocking("k", &p, 3).unwrap();
            assert_eq!(d.remaining, 9, "{at}: 3 of 4 back: {d:?}");
            let d = l.refund_blocking("k", &p, 100).unwrap();
            assert_eq!(d.remaining, 10, "{at}: {d:?}");
            // and the budget is exactly the limit again: 10 fit, the 11th does not
            for i in 0..10 {
                assert!(l.check_blocking("k", &p, 1).unwrap().allowed, "{at}: {i}");
            }
            assert!(!l.check_blocking("k", &p, 1).unwrap().allowed, "{at}");
            l.reset_blocking("k", &p).unwrap();
            l.reset_blocking("fresh", &p).unwrap();
        }
    }
}

#[test]
fn settle_gives_back_the_unused_part_and_charges_the_excess() {
    let server = RedisServer::start();
    for (engine, l, clock) in engines(&server) {
        for p in policies() {
            let at = format!("{engine}, {}", p.name());
            clock.set_us(T0 + 100_000);
            let (d, r) = l.reserve_blocking("k", &p, 8).unwrap();
            assert!(d.allowed, "{at}");
            assert_eq!(
                d.source,
                if engine == "redis" {
                    Source::Redis
                } else {
                    Source::Memory
                }
            );
            let r = r.unwrap();
            assert_eq!(
                (r.units, r.policy.as_str(), r.key.as_str()),
                (8, p.name(), "k")
            );
            // other traffic after the reservation
            assert!(l.check_blocking("k", &p, 1).unwrap().allowed, "{at}");
            let d = l.settle_with_blocking(&p, &r, 3).unwrap();
            assert!(d.allowed, "{at}");
            assert_eq!(d.remaining, 6, "{at}: 3 + 1 used: {d:?}");
            let (_, r2) = l.reserve_blocking("k", &p, 2).unwrap();
            let d = l.settle_with_blocking(&p, &r2.unwrap(), 7).unwrap();
            assert_eq!(d.remaining, 0, "{at}: 5 more charged: {d:?}");
            let d = l.check_blocking("k", &p, 1).unwrap();
            assert!(!d.allowed, "{at}: {d:?}");
            l.reset_blocking("k", &p).unwrap();
            // a reservation larger than the limit is denied, with nothing to settle
            let (d, r) = l.reserve_blocking("k", &p, 11).unwrap();
            assert!(
                !d.allowed && d.retry_after.is_none() && r.is_none(),
                "{at}: {d:?}"
            );
        }
    }
}

#[test]
fn a_settle_gives_back_to_the_window_that_admitted_it_not_a_later_one() {
    let server = RedisServer::start();
    for (engine, l, clock) in engines(&server) {
        let s = Duration::from_secs(1);
        let fw = Policy::new("fw", Limit::fixed_window(10, s)).unwrap();
        let sw = Policy::new("sw", Limit::sliding_window(10, s)).unwrap();
        // fixed window: reserved late in one window, settled in the next: the next
        // window's budget is not raised
        clock.set_us(T0 + 900_000);
        let (_, r) = l.reserve_blocking("k", &fw, 8).unwrap();
        clock.set_us(T0 + SEC + 100_000);
        assert!(l.check_blocking("k", &fw, 10).unwrap().allowed, "{engine}");
        let d = l.settle_with_blocking(&fw, &r.unwrap(), 0).unwrap();
        assert_eq!(
            d.remaining, 0,
            "{engine}: nothing given to a later window: {d:?}"
        );
        assert!(!l.check_blocking("k", &fw, 1).unwrap().allowed, "{engine}");
        // sliding window: settled in the next window, the units come off the previous
        // window's counter (its weight), never the current one's
        clock.set_us(T0 + 900_000);
        let (_, r) = l.reserve_blocking("k", &sw, 10).unwrap();
        clock.set_us(T0 + SEC + 500_000);
        // previous 10 at weight 0.5: 5 remain
        assert_eq!(l.peek_blocking("k", &sw).unwrap().remaining, 5, "{engine}");
        let d = l.settle_with_blocking(&sw, &r.unwrap(), 2).unwrap();
        // previous 2 at weight 0.5: 9 remain
        assert_eq!(d.remaining, 9, "{engine}: {d:?}");
        // two windows later the reservation's units count no more: nothing to give back
        clock.set_us(T0 + 3 * SEC);
        let (_, r) = l.reserve_blocking("j", &sw, 4).unwrap();
        clock.set_us(T0 + 5 * SEC + 1);
        assert!(l.check_blocking("j", &sw, 10).unwrap().allowed);
        let d = l.settle_with_blocking(&sw, &r.unwrap(), 0).unwrap();
        assert_eq!(d.remaining, 0, "{engine}: {d:?}");
    }
}

#[test]
fn a_sliding_log_settle_gives_back_to_its_own_entry() {
    let server = RedisServer::start();
    for (engine, l, clock) in engines(&server) {
        let sl = Policy::new("sl", Limit::sliding_log(10, Duration::from_secs(1))).unwrap();
        clock.set_us(T0);
        let (_, r) = l.reserve_blocking("k", &sl, 6).unwrap();
        clock.set_us(T0 + 400_000);
        assert!(l.check_blocking("k", &sl, 3).unwrap().allowed);
        // 6 reserved, 1 used: 5 back, to the entry recorded at T0
        let d = l.settle_with_blocking(&sl, &r.unwrap(), 1).unwrap();
        assert_eq!(d.remaining, 6, "{engine}: {d:?}");
        // the reservation's 1 unit expires at T0 + 1 s, the 3 at T0 + 1.4 s
        clock.set_us(T0 + SEC);
        assert_eq!(l.peek_blocking("k", &sl).unwrap().remaining, 7, "{engine}");
        clock.set_us(T0 + SEC + 400_000);
        assert_eq!(l.peek_blocking("k", &sl).unwrap().remaining, 10, "{engine}");
    }
}

#[test]
fn concurrency_policies_and_bad_arguments_are_invalid_arguments() {
    let l = Limiter::memory();
    let cc = Policy::new("cc", Limit::concurrency(2, Duration::from_secs(1))).unwrap();
    for e in [
        l.charge_blocking("k", &cc, 1).unwrap_err(),
        l.refund_blocking("k", &cc, 1).unwrap_err(),
        l.reserve_blocking("k", &cc, 1).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let m = e.to_string();
        assert!(m.contains("acquire") && m.contains("release"), "{m}");
    }
    let fw = Policy::new("fw", Limit::fixed_window(10, Duration::from_secs(1))).unwrap();
    let e = l.charge_blocking("k", &fw, 0).unwrap_err();
    assert!(e.to_string().contains("cost"), "{e}");
    let e = l.charge_blocking("", &fw, 1).unwrap_err();
    assert!(e.to_string().contains("key"), "{e}");
    let (_, r) = l.reserve_blocking("k", &fw, 2).unwrap();
    let mut r = r.unwrap();
    for units in [0, 11] {
        r.units = units;
        let e = l.settle_with_blocking(&fw, &r, 1).unwrap_err();
        assert!(e.to_string().contains("reservation.units"), "{units}: {e}");
    }
    r.units = 2;
    r.policy = "other".into();
    let e = l.settle_with_blocking(&fw, &r, 1).unwrap_err();
    assert!(e.to_string().contains("reservation.policy"), "{e}");
    let e = l.settle_blocking(&r, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownPolicy, "{e}");
    r.policy = "fw".into();
    r.at_us = u64::MAX;
    let e = l.settle_with_blocking(&fw, &r, 1).unwrap_err();
    assert!(e.to_string().contains("reservation.at_us"), "{e}");
}

#[test]
fn charges_and_refunds_are_counted_in_the_metrics() {
    // a policy of the config: settle finds it by the reservation's name
    let l = Limiter::from_json(
        r#"{"policies": {"fw": {"algorithm": "fixed_window", "limit": 10, "window": "1m"}}}"#,
    )
    .unwrap();
    let fw = l.policy("fw").unwrap();
    l.charge_blocking("k", &fw, 4).unwrap();
    l.refund_blocking("k", &fw, 1).unwrap();
    let (_, r) = l.reserve_blocking("k", &fw, 3).unwrap();
    l.settle_blocking(&r.unwrap(), 1).unwrap();
    let m = l.metrics();
    let p = m.policies.iter().find(|p| p.policy == "fw").unwrap();
    assert_eq!((p.charged_units, p.refunded_units, p.allowed), (4, 3, 1));
    let text = m.to_prometheus();
    assert!(
        text.contains("shardlimit_charged_units_total{policy=\"fw\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("shardlimit_refunded_units_total{policy=\"fw\"} 3"),
        "{text}"
    );
}

/// 64 callers at once on one key, each reserving, settling at a cost of its own, charging
/// and refunding: on every algorithm the key's budget afterwards is exactly the limit minus
/// what they used (the clock stands still, so nothing refills or expires).
#[test]
fn sixty_four_concurrent_settles_and_charges_keep_the_books_exact() {
    let server = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let limit = 100_000;
    let all = [
        ("fw", Limit::fixed_window(limit, hour)),
        ("sw", Limit::sliding_window(limit, hour)),
        ("sl", Limit::sliding_log(limit, hour)),
        ("tb", Limit::token_bucket(limit, 1.0)),
        ("lb", Limit::leaky_bucket(limit, 1.0)),
    ];
    for (engine, l, _clock) in engines(&server) {
        for (name, lim) in &all {
            let p = Policy::new(name, lim.clone()).unwrap();
            let used = sixty_four_settlers(&l, &p);
            let d = l.peek_blocking("hot", &p).unwrap();
            assert_eq!(d.remaining, limit - used, "{engine}, {name}: {d:?}");
        }
    }
}

/// The most a sliding-log settle rewrites: 256 later entries renumbered (beyond, the units
/// stay counted), in one script call that costs Redis well under a few ms; with 257 later
/// entries the units stay counted and the call costs less. The memory engine agrees.
#[test]
fn a_sliding_log_settle_rewrites_at_most_256_later_entries_within_a_few_ms() {
    let server = RedisServer::start();
    let mut out = Vec::new();
    for later in [256u64, 257] {
        let mut remaining = Vec::new();
        for (engine, l, _clock) in engines(&server) {
            let p =
                Policy::new("sl", Limit::sliding_log(100_000, Duration::from_secs(3600))).unwrap();
            let (_, r) = l.reserve_blocking("k", &p, 10).unwrap();
            for _ in 0..later {
                assert!(l.check_blocking("k", &p, 1).unwrap().allowed);
            }
            let before = (engine == "redis").then(|| server.main_thread_cpu_us());
            let d = l.settle_with_blocking(&p, &r.unwrap(), 0).unwrap();
            if let Some(before) = before {
                let cpu = server.main_thread_cpu_us() - before;
                eprintln!("settle with {later} later entries: {cpu} µs of Redis CPU");
                assert!(cpu < 5_000, "{cpu} µs");
                out.push(cpu);
            }
            remaining.push(d.remaining);
        }
        assert_eq!(remaining[0], remaining[1], "both engines");
        let want = if later == 256 {
            100_000 - 256
        } else {
            100_000 - 257 - 10
        };
        assert_eq!(remaining[0], want, "{later} later entries");
    }
}

// ---- every policy shape: exact rates, per-key window offsets, overrides, multi-limit ----

/// 300,000/s (the interval is 10/3 µs per token, kept exact) with room for 10 s of it:
/// a first chunk of a million tokens puts the bucket 10,000,000 ticks of 1/3 µs ahead (so
/// that Redis keeps its state for 3 s of real time: its expiry follows the wall clock, not
/// the injected one); then charged one token a µs, it refills 0.3 tokens a µs, so after n
/// more charges it is 10,000,000 + 7n ticks ahead and has floor((30,000,000 - ahead) / 10)
/// tokens left, to the token (rounded to 3 µs a token it would have 3,333 more). Then in
/// chunks, then into debt, whose retry_after is exact too. Both engines, the same decisions.
#[test]
fn an_exact_rate_bucket_is_charged_exactly_to_the_token() {
    let server = RedisServer::start();
    let p = Policy::new("llm", Limit::token_bucket(3_000_000, 300_000.0)).unwrap();
    let mut seen: Vec<Vec<Shape>> = Vec::new();
    for (engine, l, clock) in engines(&server) {
        let mut trace = Vec::new();
        let d = l.charge_blocking("tokens", &p, 1_000_000).unwrap();
        assert_eq!(d.remaining, 2_000_000, "{engine}");
        let n = 10_000u64;
        for i in 1..=n {
            clock.set_us(T0 + i);
            let d = l.charge_blocking("tokens", &p, 1).unwrap();
            assert!(d.allowed, "{engine}");
            let ahead = 10_000_000 + 7 * i;
            assert_eq!(
                d.remaining,
                (30_000_000 - ahead) / 10,
                "{engine}: charge {i}"
            );
        }
        // in chunks, at one instant: 1,990,000 more, 10,000 at a time
        let mut d = None;
        for _ in 0..199 {
            d = Some(l.charge_blocking("tokens", &p, 10_000).unwrap());
        }
        let d = d.unwrap();
        let ahead = 10_000_000 + 7 * n + 19_900_000;
        assert_eq!(d.remaining, (30_000_000 - ahead) / 10, "{engine}: {d:?}");
        trace.push(shape(&d));
        // the rest of the bucket and 100 more: 100 tokens of debt
        let rest = d.remaining;
        let d = l.charge_blocking("tokens", &p, rest + 100).unwrap();
        assert_eq!(d.remaining, 0, "{engine}");
        trace.push(shape(&d));
        let denied = l.check_blocking("tokens", &p, 1).unwrap();
        assert!(!denied.allowed, "{engine}");
        // past full by ahead + 10·(rest + 100) + one token's 10 - 30,000,000 ticks
        let over = ahead + 10 * (rest + 100) + 10 - 30_000_000;
        assert_eq!(us(denied.retry_after), Some(over.div_ceil(3)), "{engine}");
        trace.push(shape(&denied));
        // a refund of 101 repays the debt exactly and frees one token
        let d = l.refund_blocking("tokens", &p, 101).unwrap();
        assert_eq!(d.remaining, 1, "{engine}: {d:?}");
        trace.push(shape(&d));
        // a reservation of that token settled at 0 gives it back
        let (d, r) = l.reserve_blocking("tokens", &p, 1).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 0), "{engine}: {d:?}");
        let d = l.settle_with_blocking(&p, &r.unwrap(), 0).unwrap();
        assert_eq!(d.remaining, 1, "{engine}: {d:?}");
        trace.push(shape(&d));
        // 10 µs later exactly 3 more tokens
        clock.set_us(T0 + n + 10);
        let d = l.peek_blocking("tokens", &p).unwrap();
        assert_eq!(d.remaining, 4, "{engine}: {d:?}");
        trace.push(shape(&d));
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1], "redis and memory differ");
}

/// A key of `"window_offset": "per_key"` whose window (1 s) starts between 100 ms and 900 ms
/// past the aligned second: its offset window [T0 + o, T0 + o + 1 s) holds an aligned
/// boundary.
fn offset_key() -> (String, u64) {
    (0..)
        .map(|i| format!("tenant:{i}"))
        .map(|k| {
            let o = shardlimit::window_offset_us(&k, SEC);
            (k, o)
        })
        .find(|(_, o)| (100_000..900_000).contains(o))
        .unwrap()
}

/// A charge, refund, reserve and settle on windows placed per key act on the key's own
/// window: a reservation made before an aligned boundary and settled after it (the same
/// offset window) gives back; a charge's debt lasts until the offset window ends.
#[test]
fn offset_windows_settle_into_the_window_that_admitted() {
    let server = RedisServer::start();
    let (key, o) = offset_key();
    let mut seen: Vec<Vec<Shape>> = Vec::new();
    for (engine, l, clock) in engines(&server) {
        let mut trace = Vec::new();
        for algo in ["fixed_window", "sliding_window"] {
            let at = format!("{engine}, {algo}");
            let lim = if algo == "fixed_window" {
                Limit::fixed_window(10, Duration::from_secs(1))
            } else {
                Limit::sliding_window(10, Duration::from_secs(1))
            };
            let p = Policy::new(algo, lim)
                .unwrap()
                .with_window_offset(shardlimit::WindowOffset::PerKey)
                .unwrap();
            let start = T0 + 10 * SEC + o; // the key's window starts here
            clock.set_us(start + 50_000);
            let (d, r) = l.reserve_blocking(&key, &p, 6).unwrap();
            assert_eq!(d.remaining, 4, "{at}: {d:?}");
            // past the aligned second, inside the key's window
            clock.set_us(T0 + 11 * SEC + 10_000);
            assert!(T0 + 11 * SEC < start + SEC);
            let d = l.settle_with_blocking(&p, &r.unwrap(), 1).unwrap();
            assert_eq!(d.remaining, 9, "{at}: 5 of 6 came back: {d:?}");
            trace.push(shape(&d));
            let d = l.charge_blocking(&key, &p, 20).unwrap();
            assert_eq!(d.remaining, 0, "{at}");
            trace.push(shape(&d));
            let d = l.refund_blocking(&key, &p, 2).unwrap();
            trace.push(shape(&d));
            if algo == "fixed_window" {
                // debt (20 - 2 + 1 = 19 of 10) until the key's window ends
                assert_eq!(d.remaining, 0, "{at}");
                let denied = l.check_blocking(&key, &p, 1).unwrap();
                assert_eq!(
                    us(denied.retry_after),
                    Some(start + SEC - (T0 + 11 * SEC + 10_000)),
                    "{at}"
                );
                trace.push(shape(&denied));
            }
            l.reset_blocking(&key, &p).unwrap();
        }
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1], "redis and memory differ");
}

/// Engines of a config with a policy that takes overrides (a fixed window of 10 an hour).
fn override_engines(server: &RedisServer) -> Vec<(&'static str, Limiter, Arc<ManualClock>)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    let policies =
        r#"{"api": {"algorithm": "fixed_window", "limit": 10, "window": "1h", "overrides": true}}"#;
    let redis = Limiter::from_json(&support::config(&[server], policies)).unwrap();
    let memory = Limiter::from_json(&format!(r#"{{"policies": {policies}}}"#)).unwrap();
    let mut out = Vec::new();
    for (name, l) in [("redis", redis), ("memory", memory)] {
        let c = ManualClock::new(T0);
        out.push((name, l.with_clock(c.clone()).unwrap(), c));
    }
    out
}

/// charge, refund, reserve and settle on a policy with overrides act on the key's limit in
/// force: the override when it has one (read in the same script call), else the policy's;
/// a reservation made under an override settles against its state, and a key whose
/// override changes is charged under the new one on the next call.
#[test]
fn charges_and_settles_apply_the_keys_override() {
    let server = RedisServer::start();
    let mut seen: Vec<Vec<Shape>> = Vec::new();
    for (engine, l, _clock) in override_engines(&server) {
        let p = l.policy("api").unwrap();
        let mut trace = Vec::new();
        // no override: the policy's 10
        let d = l.charge_blocking("plain", &p, 4).unwrap();
        assert_eq!((d.limit, d.remaining), (10, 6), "{engine}");
        // an override of 100 an hour (the same algorithm: the same counter)
        l.set_override_blocking("vip", "api", "100/hour", None)
            .unwrap();
        let d = l.charge_blocking("vip", &p, 50).unwrap();
        assert_eq!((d.limit, d.remaining), (100, 50), "{engine}: {d:?}");
        trace.push(shape(&d));
        let (d, r) = l.reserve_blocking("vip", &p, 40).unwrap();
        assert!(d.allowed, "{engine}: 40 of the override's 50 left: {d:?}");
        assert_eq!(d.remaining, 10, "{engine}");
        let r = r.unwrap();
        assert_eq!(r.units, 40, "{engine}");
        let d = l.settle_with_blocking(&p, &r, 15).unwrap();
        assert_eq!((d.limit, d.remaining), (100, 35), "{engine}: {d:?}");
        trace.push(shape(&d));
        let d = l.refund_blocking("vip", &p, 5).unwrap();
        assert_eq!(d.remaining, 40, "{engine}");
        trace.push(shape(&d));
        // a charge the policy's limit would cap at 20 goes to the override's 200
        let d = l.charge_blocking("vip", &p, 150).unwrap();
        assert_eq!((d.remaining, d.limit), (0, 100), "{engine}");
        let d = l.refund_blocking("vip", &p, 120).unwrap();
        assert_eq!(
            d.remaining, 20,
            "{engine}: 60 + 150 (capped at 200) - 120: {d:?}"
        );
        // a reservation made under the override, settled once it is gone: the policy's
        // counter (the same algorithm's state) gets the unused units back, never refused
        // for holding more than the policy's limit
        let (_, big) = l.reserve_blocking("vip", &p, 15).unwrap();
        l.delete_override_blocking("vip", "api").unwrap();
        let d = l.settle_with_blocking(&p, &big.unwrap(), 5).unwrap();
        assert_eq!(
            (d.limit, d.remaining),
            (10, 0),
            "{engine}: 80 + 15 - 10 used: {d:?}"
        );
        l.set_override_blocking("vip", "api", "100/hour", None)
            .unwrap();
        assert_eq!(
            l.peek_blocking("vip", &p).unwrap().remaining,
            15,
            "{engine}"
        );
        l.refund_blocking("vip", &p, 5).unwrap();
        // an override of another algorithm has its own state
        l.set_override_blocking(
            "vip",
            "api",
            r#"{"algorithm": "token_bucket", "capacity": 7, "refill_per_sec": 1}"#,
            None,
        )
        .unwrap();
        let d = l.charge_blocking("vip", &p, 3).unwrap();
        assert_eq!((d.limit, d.remaining), (7, 4), "{engine}: {d:?}");
        trace.push(shape(&d));
        // the override deleted: the policy's counter again (the same algorithm's: 80 used,
        // in debt)
        l.delete_override_blocking("vip", "api").unwrap();
        let d = l.charge_blocking("vip", &p, 1).unwrap();
        assert_eq!((d.limit, d.remaining), (10, 0), "{engine}: {d:?}");
        trace.push(shape(&d));
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1], "redis and memory differ");
}

/// A multi-limit policy (5 a second, 100 a minute): a charge consumes in both (the second's
/// goes into debt), a refund gives back in both, a reservation is the all-or-nothing check
/// and settles in both; the decision describes the limit with the fewest left.
#[test]
fn multi_limit_policies_charge_refund_and_settle_every_limit() {
    let server = RedisServer::start();
    let p = Policy::from_rate("5/second; 100/minute", shardlimit::Algorithm::FixedWindow).unwrap();
    assert!(p.is_multi());
    let mut seen: Vec<Vec<(Shape, Option<usize>)>> = Vec::new();
    for (engine, l, clock) in engines(&server) {
        let mut trace = Vec::new();
        let mut t = |d: &Decision| trace.push((shape(d), d.limit_index));
        clock.set_us(T0 + 200_000);
        let d = l.charge_blocking("k", &p, 7).unwrap();
        assert!(d.allowed, "{engine}");
        assert_eq!(
            (d.limit_index, d.limit, d.remaining),
            (Some(0), 5, 0),
            "{engine}: {d:?}"
        );
        assert_eq!(d.quotas.len(), 2, "{engine}");
        t(&d);
        let denied = l.check_blocking("k", &p, 1).unwrap();
        assert!(!denied.allowed, "{engine}");
        assert_eq!(
            us(denied.retry_after),
            Some(800_000),
            "{engine}: the second's end"
        );
        t(&denied);
        // 3 back in both: the second has 1 left, the minute 96
        let d = l.refund_blocking("k", &p, 3).unwrap();
        assert_eq!(
            (d.limit_index, d.remaining),
            (Some(0), 1),
            "{engine}: {d:?}"
        );
        t(&d);
        // the next second: a reservation of 5 (the second's whole budget), settled at 2
        clock.set_us(T0 + SEC + 100_000);
        let (d, r) = l.reserve_blocking("k", &p, 5).unwrap();
        assert!(d.allowed, "{engine}: {d:?}");
        t(&d);
        let r = r.unwrap();
        // settled in the second after (the second's window is over: nothing back there;
        // the minute gets 3 back)
        clock.set_us(T0 + 2 * SEC + 100_000);
        let d = l.settle_with_blocking(&p, &r, 2).unwrap();
        // the minute: 4 + 5 - 3 = 6 used; the second: nothing used
        assert_eq!(
            (d.limit_index, d.remaining),
            (Some(0), 5),
            "{engine}: {d:?}"
        );
        let peek = l.peek_blocking("k", &p).unwrap();
        t(&peek);
        // a reservation settled in its own second gives back to both
        let (_, r) = l.reserve_blocking("k", &p, 4).unwrap();
        let d = l.settle_with_blocking(&p, &r.unwrap(), 1).unwrap();
        assert_eq!(
            (d.limit_index, d.remaining),
            (Some(0), 4),
            "{engine}: {d:?}"
        );
        t(&d);
        // the minute has 100 - 6 - 1 = 93 left: a charge of 95 puts it in debt
        let d = l.charge_blocking("k", &p, 95).unwrap();
        assert_eq!(d.remaining, 0, "{engine}");
        t(&d);
        clock.set_us(T0 + 3 * SEC);
        let denied = l.check_blocking("k", &p, 1).unwrap();
        assert_eq!(
            denied.limit_index,
            Some(1),
            "{engine}: the minute denies: {denied:?}"
        );
        t(&denied);
        seen.push(trace);
    }
    assert_eq!(seen[0], seen[1], "redis and memory differ");
}

/// 64 callers at once on one key of a multi-limit policy and of an exact-rate bucket,
/// each reserving, settling at a cost of its own, charging and refunding: the books stay
/// exact (the clock stands still). The decision describes the limit with the fewest units
/// left, so each multi-limit shape is run twice, once with each limit the tighter one.
#[test]
fn sixty_four_concurrent_settles_keep_multi_limit_and_exact_books() {
    let server = RedisServer::start();
    use shardlimit::Algorithm as A;
    // (rate, algorithm, the limit a peek describes, its units)
    let shapes = [
        ("100000/hour; 100300/day", A::FixedWindow, Some(0), 100_000),
        ("100300/hour; 100000/day", A::FixedWindow, Some(1), 100_000),
        (
            "100000/minute; 100300/hour",
            A::SlidingWindow,
            Some(0),
            100_000,
        ),
        (
            "100300/minute; 100000/hour",
            A::SlidingWindow,
            Some(1),
            100_000,
        ),
    ];
    // (300,000/s with room for 10 s of it: see an_exact_rate_bucket_is_charged_exactly...)
    let buckets = [
        Limit::token_bucket(3_000_000, 300_000.0),
        Limit::leaky_bucket(3_000_000, 300_000.0),
    ];
    for (engine, l, _clock) in engines(&server) {
        let all = shapes
            .iter()
            .map(|(rate, algo, index, limit)| {
                let p = Policy::from_rate(rate, *algo).unwrap();
                (format!("{rate} ({algo:?})"), p, *index, *limit)
            })
            .chain(buckets.iter().map(|b| {
                let p = Policy::new("llm", b.clone()).unwrap();
                (format!("{b:?}"), p, None, 3_000_000)
            }));
        for (at, p, index, limit) in all {
            // a million first (a bucket's state then lives 3 s on Redis's wall clock)
            l.charge_blocking("hot", &p, 1_000_000.min(limit / 2))
                .unwrap();
            let before = limit - 1_000_000.min(limit / 2);
            let used = sixty_four_settlers(&l, &p);
            let d = l.peek_blocking("hot", &p).unwrap();
            let at = format!("{engine}, {at}");
            assert_eq!(d.limit_index, index, "{at}: {d:?}");
            assert_eq!(
                (d.limit, d.remaining),
                (limit, before - used),
                "{at}: {d:?}"
            );
            l.reset_blocking("hot", &p).unwrap();
        }
    }
}

/// An override entry in Redis that shardlimit did not write (every byte from Redis is
/// untrusted): a charge, refund or reserve of the key is an error naming the malformed
/// entry, never a panic or another limit's decision; other keys are unaffected.
#[test]
fn a_malformed_override_entry_is_an_error_not_a_charge() {
    let server = RedisServer::start();
    let (_, l, _clock) = override_engines(&server).remove(0);
    let p = l.policy("api").unwrap();
    let entry = shardlimit::keys::override_key("sl:", "api", "vip");
    for bad in [
        "garbage",
        "12 not-json",
        "0 {\"algorithm\": \"fixed_window\"}",
    ] {
        redis::cmd("SET")
            .arg(&entry)
            .arg(bad)
            .exec(&mut server.conn())
            .unwrap();
        for e in [
            l.charge_blocking("vip", &p, 1).unwrap_err(),
            l.refund_blocking("vip", &p, 1).unwrap_err(),
            l.reserve_blocking("vip", &p, 1).unwrap_err(),
        ] {
            assert!(e.to_string().contains("malformed override"), "{bad}: {e}");
        }
    }
    assert_eq!(l.charge_blocking("plain", &p, 1).unwrap().remaining, 9);
}

/// A multi-limit policy with a sliding log among its limits: a reservation's unused units go
/// back to the log's own entry of the reservation's time and to the window's counter.
#[test]
fn a_multi_limit_reservation_settles_in_a_sliding_log_limit_too() {
    let server = RedisServer::start();
    let p = Policy::multi(
        "plan",
        vec![
            Limit::sliding_log(10, Duration::from_secs(60)),
            Limit::fixed_window(100, Duration::from_secs(3600)),
        ],
    )
    .unwrap();
    let mut seen = Vec::new();
    for (engine, l, clock) in engines(&server) {
        clock.set_us(T0 + 5 * SEC);
        let (d, r) = l.reserve_blocking("k", &p, 8).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 2), "{engine}: {d:?}");
        clock.set_us(T0 + 6 * SEC);
        l.charge_blocking("k", &p, 1).unwrap();
        let d = l.settle_with_blocking(&p, &r.unwrap(), 3).unwrap();
        // the log holds 3 + 1, the window 4
        assert_eq!(
            (d.limit_index, d.remaining),
            (Some(0), 6),
            "{engine}: {d:?}"
        );
        // the reservation's entry expires with its own time, a minute after it
        clock.set_us(T0 + 65 * SEC);
        let d = l.peek_blocking("k", &p).unwrap();
        assert_eq!(d.remaining, 9, "{engine}: {d:?}");
        seen.push(shape(&d));
    }
    assert_eq!(seen[0], seen[1], "redis and memory differ");
}

/// The guide's settle snippet ("Charge, refund, reserve and settle"), read from docs/guide.md
/// and run as written here: the test fails when either changes without the other.
#[test]
fn readme_settle_snippet_runs() -> shardlimit::Result<()> {
    const SNIPPET: &str = r####"let limiter = shardlimit::Limiter::from_json(r#"{"policies": {"tokens": "5000000/minute"}}"#)?;
let p = limiter.policy("tokens")?; // an exact 5M tokens per minute (a token bucket would do too)
let (d, reservation) = limiter.reserve("tenant:7", &p, 2_000).await?; // the estimate
assert!(d.allowed);
if let Some(r) = reservation {
    let used = 1_340; // known once the model answered
    let after = limiter.settle(&r, used).await?; // 660 units go back
    println!("{} tokens left", after.remaining);
}
limiter.charge("tenant:7", &p, 500).await?; // a background job's usage, after the fact
"####;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide.md"))
        .expect("docs/guide.md");
    assert!(
        readme.contains(&format!("```rust\n{SNIPPET}```")),
        "the guide's settle snippet differs from this test's copy"
    );
    let run = async {
        let limiter =
            shardlimit::Limiter::from_json(r#"{"policies": {"tokens": "5000000/minute"}}"#)?;
        let p = limiter.policy("tokens")?; // an exact 5M tokens per minute (a token bucket would do too)
        let (d, reservation) = limiter.reserve("tenant:7", &p, 2_000).await?; // the estimate
        assert!(d.allowed);
        if let Some(r) = reservation {
            let used = 1_340; // known once the model answered
            let after = limiter.settle(&r, used).await?; // 660 units go back
            println!("{} tokens left", after.remaining);
        }
        limiter.charge("tenant:7", &p, 500).await?; // a background job's usage, after the fact
        Ok::<_, shardlimit::Error>(())
    };
    // a memory limiter's futures never wait: its block_on polls them to the end at once
    shardlimit::Limiter::memory().block_on(run)
}
