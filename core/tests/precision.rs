//! Per-key window offsets and exact bucket rates on both engines:
//! the config fields, injected time and the server clock, Redis key names and state (a
//! rolling upgrade never misreads old state), local admission, layered checks whose
//! refund crosses shards, and the reshard handoff. The decisions themselves are pinned by
//! `tests/vectors/precision.json` (`vectors.rs`) and the random sequences of
//! `differential.rs`.

mod support;

use shardlimit::routing::shard_index;
use shardlimit::{
    window_offset_us, Config, Layer, Limit, Limiter, ManualClock, Policy, Source, WindowOffset,
};
use std::sync::Arc;
use std::time::Duration;
use support::RedisServer;

const T0: u64 = 1_800_000_000_000_000;
const HOUR_US: u64 = 3_600_000_000;

fn err(json: &str) -> String {
    Config::from_json(json).unwrap_err().to_string()
}

/// The time from `now` to the end of `key`'s current window of `w` µs under per-key offsets.
fn reset_of(key: &str, now: u64, w: u64) -> u64 {
    let o = window_offset_us(key, w);
    w - (now + w - o) % w
}

#[test]
fn window_offset_in_the_config_and_the_builder() {
    let cfg = Config::from_json(
        r#"{"policies": {
            "a": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offset": "per_key"},
            "b": {"algorithm": "sliding_window", "limit": 5, "window": "1m", "window_offset": "per_key"},
            "c": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offset": "none"},
            "d": {"algorithm": "fixed_window", "limit": 5, "window": "1d"},
            "e": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 300000, "window_offset": "none"}
        }}"#,
    )
    .unwrap();
    let offset = |n: &str| cfg.policies[n].window_offset();
    assert_eq!(offset("a"), WindowOffset::PerKey);
    assert_eq!(offset("b"), WindowOffset::PerKey);
    assert_eq!(offset("c"), WindowOffset::None);
    assert_eq!(offset("d"), WindowOffset::None, "the default");
    assert_eq!(offset("e"), WindowOffset::None);
    // errors name the field and say why
    let e = err(
        r#"{"policies": {"p": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 1, "window_offset": "per_key"}}}"#,
    );
    assert!(
        e.contains("policies.p.window_offset") && e.contains("fixed_window and sliding_window"),
        "{e}"
    );
    let e = err(
        r#"{"policies": {"p": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offset": "midnight"}}}"#,
    );
    assert!(
        e.contains("policies.p.window_offset") && e.contains("per_key"),
        "{e}"
    );
    let e = err(
        r#"{"policies": {"p": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offset": 3}}}"#,
    );
    assert!(e.contains("policies.p.window_offset"), "{e}");
    // strict: a misspelt field is still an unknown field
    let e = err(
        r#"{"policies": {"p": {"algorithm": "fixed_window", "limit": 5, "window": "1d", "window_offsets": "per_key"}}}"#,
    );
    assert!(e.contains("window_offsets"), "{e}");
    // a rate that cannot be exact is refused, saying why
    let e = err(
        r#"{"policies": {"p": {"algorithm": "token_bucket", "capacity": 1000000, "refill_per_sec": 123.456789}}}"#,
    );
    assert!(
        e.contains("policies.p.refill_per_sec")
            && e.contains("123456789/1000000")
            && e.contains("2^50"),
        "{e}"
    );
    // the builder
    let fw = Policy::new("w", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
    let p = fw.with_window_offset(WindowOffset::PerKey).unwrap();
    assert_eq!(
        (p.window_offset(), fw.window_offset()),
        (WindowOffset::PerKey, WindowOffset::None)
    );
    assert_eq!(
        p.with_window_offset(WindowOffset::None)
            .unwrap()
            .window_offset(),
        WindowOffset::None
    );
    let tb = Policy::new("t", Limit::token_bucket(5, 1.0)).unwrap();
    let e = tb.with_window_offset(WindowOffset::PerKey).unwrap_err();
    assert!(e.to_string().contains("policies.t.window_offset"), "{e}");
    assert!(tb.with_window_offset(WindowOffset::None).is_ok());
}

fn engines(server: &RedisServer, policies: &str) -> Vec<(Limiter, Arc<ManualClock>)> {
    redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
    let redis = Limiter::from_json(&support::config(&[server], policies)).unwrap();
    let memory =
        Limiter::new(Config::from_json(&format!(r#"{{"policies": {policies}}}"#)).unwrap())
            .unwrap();
    [redis, memory]
        .into_iter()
        .map(|l| {
            let c = ManualClock::new(T0);
            (l.with_clock(c.clone()).unwrap(), c)
        })
        .collect()
}

/// 300 keys of a daily limit: each key's window ends at its own offset (spread over the
/// day, not at midnight), on both engines, and opens again exactly then.
#[test]
fn per_key_windows_reset_at_each_keys_offset_on_both_engines() {
    let server = RedisServer::start();
    let day = 24 * HOUR_US;
    for (l, clock) in engines(
        &server,
        r#"{"daily": {"algorithm": "fixed_window", "limit": 2, "window": "1d", "window_offset": "per_key"},
            "minute": {"algorithm": "sliding_window", "limit": 2, "window": "1m", "window_offset": "per_key"}}"#,
    ) {
        let daily = l.policy("daily").unwrap();
        let minute = l.policy("minute").unwrap();
        let keys: Vec<String> = (0..300).map(|i| format!("tenant:{i}")).collect();
        let mut hours = std::collections::HashSet::new();
        for k in &keys {
            clock.set_us(T0);
            let want = reset_of(k, T0, day);
            let d = l.check_blocking(k, &daily, 2).unwrap();
            assert!(d.allowed);
            assert_eq!(d.reset_after, Duration::from_micros(want), "{k}");
            hours.insert(want / HOUR_US);
            let d = l.check_blocking(k, &daily, 1).unwrap();
            assert!(!d.allowed);
            assert_eq!(d.retry_after, Some(Duration::from_micros(want)), "{k}");
            // one µs before the key's boundary: still denied; at it: a new window
            clock.set_us(T0 + want - 1);
            assert!(!l.check_blocking(k, &daily, 1).unwrap().allowed, "{k}");
            clock.set_us(T0 + want);
            let d = l.check_blocking(k, &daily, 2).unwrap();
            assert!(d.allowed, "{k}");
            assert_eq!(d.reset_after, Duration::from_micros(day));
            // the sliding window's sub-windows are placed the same way
            clock.set_us(T0);
            let d = l.check_blocking(k, &minute, 1).unwrap();
            let m = 60_000_000;
            let elapsed = m - reset_of(k, T0, m);
            assert_eq!(d.reset_after, Duration::from_micros(2 * m - elapsed), "{k}");
        }
        assert!(hours.len() >= 23, "resets spread over the day: {hours:?}");
    }
}

/// The server-clock path (no injected clock: the script reads TIME): the key's window ends
/// at its offset on Redis's clock. An exact bucket there too.
#[test]
fn server_clock_path_places_windows_per_key_and_refills_exactly() {
    let server = RedisServer::start();
    let l = Limiter::from_json(&support::config(
        &[&server],
        r#"{"daily": {"algorithm": "fixed_window", "limit": 1, "window": "1d", "window_offset": "per_key"},
            "seven": {"algorithm": "token_bucket", "capacity": 3, "refill_per_sec": 7}}"#,
    ))
    .unwrap();
    let daily = l.policy("daily").unwrap();
    let seven = l.policy("seven").unwrap();
    let time = || -> u64 {
        let t: Vec<u64> = redis::cmd("TIME").query(&mut server.conn()).unwrap();
        t[0] * 1_000_000 + t[1]
    };
    let day = 24 * HOUR_US;
    for i in 0..50 {
        let k = format!("user:{i}");
        let before = time();
        let d = l.check_blocking(&k, &daily, 1).unwrap();
        let after = time();
        assert_eq!(d.source, Source::Redis);
        let reset = d.reset_after.as_micros() as u64;
        // the script ran at some t in [before, after]: t + reset is the key's boundary
        let o = window_offset_us(&k, day);
        let lag = (o + day - (before + reset) % day) % day;
        assert!(
            lag <= after - before,
            "{k}: reset {reset} is not at its offset"
        );
    }
    // a fresh bucket of 3 at 7/s: 3e6/7 µs to full again, rounded up, whatever the time
    let d = l.check_blocking("b", &seven, 3).unwrap();
    assert!(d.allowed);
    assert_eq!(d.reset_after, Duration::from_micros(428_572));
    let d = l.check_blocking("b", &seven, 1).unwrap();
    assert!(!d.allowed && d.retry_after.unwrap() <= Duration::from_micros(142_858));
}

/// Redis key names: a per-key offset or an exact fractional interval has a state key of
/// its own (`fo`, `so`, `tq`, `lq`), so state written before an upgrade (or by a client of
/// an older version, which rounded the rate) is never read as the new shape; every other
/// policy keeps today's keys and values.
#[test]
fn variants_have_state_keys_of_their_own() {
    let server = RedisServer::start();
    let (l, _clock) = engines(
        &server,
        r#"{"w": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "window_offset": "per_key"},
            "s": {"algorithm": "sliding_window", "limit": 5, "window": "1h", "window_offset": "per_key"},
            "n": {"algorithm": "fixed_window", "limit": 5, "window": "1h"},
            "x": {"algorithm": "token_bucket", "capacity": 3000000, "refill_per_sec": 300000},
            "y": {"algorithm": "leaky_bucket", "capacity": 100, "leak_per_sec": 7},
            "z": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 0.1}}"#,
    )
    .remove(0);
    for p in ["w", "s", "n", "y", "z"] {
        assert!(l.check_by_name_blocking("k", p, 1).unwrap().allowed);
    }
    // (most of the bucket, so that its TTL, on Redis's real clock, outlives the test)
    assert!(
        l.check_by_name_blocking("k", "x", 2_999_999)
            .unwrap()
            .allowed
    );
    let mut c = server.conn();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    keys.sort();
    let get = |k: &str| -> String { redis::cmd("GET").arg(k).query(&mut server.conn()).unwrap() };
    let shift = |w: u64| (w - window_offset_us("k", w)) % w;
    let fo = format!("sl:s:w:fo:{{k}}:{}", (T0 + shift(HOUR_US)) / HOUR_US);
    let so = format!("sl:s:s:so:{{k}}:{}", (T0 + shift(HOUR_US)) / HOUR_US);
    let fw = format!("sl:s:n:fw:{{k}}:{}", T0 / HOUR_US);
    let mut want = vec![
        fo.clone(),
        so,
        fw,
        "sl:s:x:tq:{k}".to_string(),
        "sl:s:y:lq:{k}".to_string(),
        "sl:s:z:tb:{k}".to_string(),
    ];
    want.sort();
    assert_eq!(keys, want);
    assert_eq!(get(&fo), "1");
    // exact: "T:f", the TAT T + f/Q µs (2,999,999 tokens of 10/3 µs: T0 + 9999996 and 2/3)
    assert_eq!(get("sl:s:x:tq:{k}"), format!("{}:2", T0 + 9_999_996));
    // one unit at 7/s: 1e6/7 = 142857 + 1/7 µs
    assert_eq!(get("sl:s:y:lq:{k}"), format!("{}:1", T0 + 142_857));
    // a whole-µs interval: today's format, an integer TAT
    assert_eq!(get("sl:s:z:tb:{k}"), format!("{}", T0 + 10_000_000));
}

/// Local admission reserves batches from a per-key window: never more than the limit in
/// a window, and the batch's units lapse at the key's own boundary.
#[test]
fn local_admission_with_per_key_windows() {
    let server = RedisServer::start();
    let (l, clock) = engines(
        &server,
        r#"{"p": {"algorithm": "fixed_window", "limit": 10, "window": "1h", "window_offset": "per_key",
                  "local_admission": {"max_batch": 4, "max_hold": "10m"}}}"#,
    )
    .remove(0);
    let p = l.policy("p").unwrap();
    for k in ["a", "b", "c"] {
        clock.set_us(T0);
        let want = reset_of(k, T0, HOUR_US);
        let mut allowed = 0;
        for _ in 0..30 {
            let d = l.check_blocking(k, &p, 1).unwrap();
            if d.allowed {
                allowed += 1;
                if d.source == Source::Redis {
                    assert_eq!(d.reset_after, Duration::from_micros(want), "{k}");
                }
            }
        }
        assert_eq!(allowed, 10, "{k}: the limit, no more");
        // past the key's boundary: a new window, whatever was reserved before
        clock.set_us(T0 + want);
        let mut allowed = 0;
        for _ in 0..30 {
            allowed += u64::from(l.check_blocking(k, &p, 1).unwrap().allowed);
        }
        assert_eq!(allowed, 10, "{k}: the next window's limit");
    }
}

/// A layered check whose layers live on two shards: when the second shard's layer (a
/// per-key window) denies, what the first shard admitted (an exact bucket and a per-key
/// window) is given back exactly.
#[test]
fn refunds_across_shards_restore_exact_and_offset_state() {
    let servers = [RedisServer::start(), RedisServer::start()];
    let l = Limiter::from_json(&support::config(
        &[&servers[0], &servers[1]],
        r#"{"t": {"algorithm": "token_bucket", "capacity": 3000000, "refill_per_sec": 300000},
            "w": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "window_offset": "per_key"},
            "gate": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "window_offset": "per_key"}}"#,
    ))
    .unwrap();
    // a µs before an aligned hour: any shift moves the windows' index
    let t1 = T0 + HOUR_US - 1;
    let clock = ManualClock::new(t1);
    let l = l.with_clock(clock.clone()).unwrap();
    let on = |s: u32| {
        (0..)
            .map(|i| format!("key:{i}"))
            .find(|k| shard_index(k, 2) == s)
            .unwrap()
    };
    let (a, b) = (on(0), on(1));
    let (t, w, gate) = (
        l.policy("t").unwrap(),
        l.policy("w").unwrap(),
        l.policy("gate").unwrap(),
    );
    // (most of the bucket: its TTL, on Redis's real clock, outlives the test)
    assert!(l.check_blocking(&a, &t, 2_999_000).unwrap().allowed);
    assert!(l.check_blocking(&a, &w, 2).unwrap().allowed);
    assert!(l.check_blocking(&b, &gate, 1).unwrap().allowed);
    let layers = [
        Layer::new(a.clone(), &t, 500),
        Layer::new(a.clone(), &w, 2),
        Layer::new(b.clone(), &gate, 1),
    ];
    let l2 = l.clone();
    let d = l
        .block_on(async move { l2.check_all(&layers).await })
        .unwrap();
    assert!(!d.allowed);
    assert_eq!(d.layer, Some(2));
    // nothing of the denied check stays
    assert_eq!(l.peek_blocking(&a, &t).unwrap().remaining, 1_000);
    assert_eq!(l.peek_blocking(&a, &w).unwrap().remaining, 3);
    // and a tick later the bucket has refilled 3 tokens per 10 µs, exactly
    clock.set_us(t1 + 10);
    assert_eq!(l.peek_blocking(&a, &t).unwrap().remaining, 1_003);
}

/// A reshard moves keys to a new shard; the handoff carries their per-key window counters
/// and exact bucket state (read under the key's shifted clock), so no key at its limit
/// gets a fresh budget.
#[test]
fn reshard_handoff_carries_per_key_windows_and_exact_buckets() {
    let servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let policies = r#"{"w": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "window_offset": "per_key", "on_error": "error"},
        "s": {"algorithm": "sliding_window", "limit": 2, "window": "1h", "window_offset": "per_key", "on_error": "error"},
        "t": {"algorithm": "token_bucket", "capacity": 2, "refill_per_sec": 0.007, "on_error": "error"}}"#;
    let two = support::config(&[&servers[0], &servers[1]], policies);
    let three = support::config(&[&servers[0], &servers[1], &servers[2]], policies);
    let l = Limiter::from_json(&two).unwrap();
    let keys: Vec<String> = (0..60).map(|i| format!("client:{i}")).collect();
    for k in &keys {
        for p in ["w", "s", "t"] {
            assert!(
                l.check_by_name_blocking(k, p, 2).unwrap().allowed,
                "{k} {p}"
            );
            assert!(
                !l.check_by_name_blocking(k, p, 1).unwrap().allowed,
                "{k} {p}"
            );
        }
    }
    let report = l.reload(Config::from_json(&three).unwrap()).unwrap();
    assert!(report.engine_changed && report.handoff);
    let moved = keys.iter().filter(|k| shard_index(k, 3) == 2).count();
    assert!(moved >= 10, "{moved} keys moved");
    for k in &keys {
        for p in ["w", "s", "t"] {
            let d = l.check_by_name_blocking(k, p, 1).unwrap();
            assert!(!d.allowed, "{k} {p}: a fresh budget after the reshard");
        }
    }
}

/// The guide's Rust snippet (docs/guide.md, "Window offsets and exact rates"), as written.
#[test]
fn readme_snippet_runs() -> shardlimit::Result<()> {
    let limiter = shardlimit::Limiter::from_json(
        r#"{"policies": {
    "daily": {"algorithm": "fixed_window", "limit": 10000, "window": "1d", "window_offset": "per_key"},
    "burst": {"algorithm": "token_bucket", "capacity": 300000, "refill_per_sec": 300000}}}"#,
    )?;
    let d = limiter.check_by_name_blocking("tenant:acme", "daily", 1)?;
    let day = 86_400_000_000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    // the key's day ends at its offset past midnight UTC (within the time the check took)
    let end = (now + d.reset_after.as_micros() as u64) % day;
    let o = window_offset_us("tenant:acme", day);
    assert!((end + day - o) % day < 1_000_000, "{end} {o}");
    Ok(())
}
