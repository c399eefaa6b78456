//! Layered checks (`check_all`) on policies that take per-key overrides:
//! each such layer is decided under its key's override, an override of several limits
//! expanding to its limits; on Redis the override versions are compared in the same script
//! call as their shard's layers, a newer one learnt and the check made again. Both engines
//! with an injected clock, on real Redis (one and two shards).

mod support;

use shardlimit::routing::shard_index;
use shardlimit::{Config, Layer, Limiter, ManualClock};
use std::sync::Arc;
use support::{Cluster, RedisServer};

const T0: u64 = 1_700_000_000_000_000;

const POLICIES: &str = r#"{
    "free": {"algorithm": "fixed_window", "limit": 2, "window": "1m", "overrides": true},
    "user": {"algorithm": "fixed_window", "limit": 3, "window": "1m", "overrides": true},
    "ip": {"algorithm": "fixed_window", "limit": 100, "window": "1m"}}"#;

fn memory(clock: Arc<ManualClock>) -> Limiter {
    let cfg = Config::from_json(&format!(r#"{{"policies": {POLICIES}}}"#)).unwrap();
    Limiter::new(cfg).unwrap().with_clock(clock).unwrap()
}

fn redis(servers: &[&RedisServer], clock: Arc<ManualClock>) -> Limiter {
    let l = Limiter::from_json(&support::config(servers, POLICIES)).unwrap();
    l.with_clock(clock).unwrap()
}

/// A key (`prefix` + a number) on shard `shard` of `n`.
fn key_on(prefix: &str, shard: u32, n: u32) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| shard_index(k, n) == shard)
        .unwrap()
}

/// The memory engine, and Redis with two shards (the override's tenant and the user on
/// different shards).
fn engines(a: &RedisServer, b: &RedisServer) -> [(Limiter, u32); 2] {
    [
        (memory(ManualClock::new(T0)), 1),
        (redis(&[a, b], ManualClock::new(T0)), 2),
    ]
}

#[test]
fn a_layered_check_is_limited_as_the_override() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    for (l, n) in engines(&a, &b) {
        let (free, ip) = (l.policy("free").unwrap(), l.policy("ip").unwrap());
        let tenant = key_on("tenant", 0, n);
        let addr = key_on("addr", n - 1, n);
        // moved from free (2/min) to pro (5/min) by an override
        l.set_override_blocking(&tenant, "free", "5/minute", None)
            .unwrap();
        let layers = [Layer::new(&tenant, &free, 1), Layer::new(&addr, &ip, 1)];
        let ds: Vec<_> = (0..6)
            .map(|_| l.check_all_blocking(&layers).unwrap())
            .collect();
        let allowed: Vec<bool> = ds.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, true, true, false], "{ds:?}");
        assert_eq!((ds[5].layer, ds[5].limit), (Some(0), 5), "{:?}", ds[5]);
        // the denied check consumed nothing in the other layer
        assert_eq!(l.peek_blocking(&addr, &ip).unwrap().remaining, 95);
        // another key of the policy keeps the policy's limit
        let other = key_on("other", 0, n);
        let layers = [Layer::new(&other, &free, 1), Layer::new(&addr, &ip, 1)];
        let ds: Vec<_> = (0..3)
            .map(|_| l.check_all_blocking(&layers).unwrap().allowed)
            .collect();
        assert_eq!(ds, [true, true, false]);
    }
}

#[test]
fn an_override_of_several_limits_expands_in_a_layered_check() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    for (l, n) in engines(&a, &b) {
        let (free, user) = (l.policy("free").unwrap(), l.policy("user").unwrap());
        let tenant = key_on("tenant", 0, n);
        let person = key_on("person", n - 1, n);
        l.set_override_blocking(&tenant, "free", "10/minute; 4/hour", None)
            .unwrap();
        l.set_override_blocking(&person, "user", "6/minute", None)
            .unwrap();
        let layers = [Layer::new(&tenant, &free, 1), Layer::new(&person, &user, 1)];
        let d = l.check_all_blocking(&layers).unwrap();
        assert!(d.allowed, "{d:?}");
        for _ in 0..3 {
            assert!(l.check_all_blocking(&layers).unwrap().allowed);
        }
        // the override's hourly limit (its second) denies the fifth
        let d = l.check_all_blocking(&layers).unwrap();
        assert!(!d.allowed, "{d:?}");
        assert_eq!(
            (d.layer, d.limit_index, d.limit, d.quotas.len()),
            (Some(0), Some(1), 4, 2),
            "{d:?}"
        );
        // the user layer consumed 4 of its override's 6, not 5 (nor the policy's 3)
        let p = l.peek_blocking(&person, &user).unwrap();
        assert_eq!((p.limit, p.remaining), (6, 2), "{p:?}");
    }
}

/// Another limiter changes the override between two layered checks: the next layered
/// check of the first limiter is decided under the new one (its script call finds the
/// version changed, nothing decided; what the other shard admitted is given back).
#[test]
fn an_override_changed_by_another_limiter_takes_effect_on_the_next_layered_check() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    let clock = ManualClock::new(T0);
    let one = redis(&[&a, &b], clock.clone());
    let two = redis(&[&a, &b], clock);
    let (free, ip) = (one.policy("free").unwrap(), one.policy("ip").unwrap());
    let tenant = key_on("tenant", 0, 2);
    let addr = key_on("addr", 1, 2);
    let layers = [Layer::new(&tenant, &free, 1), Layer::new(&addr, &ip, 1)];
    // `one` knows the key has no override; `two` gives it one
    assert_eq!(one.check_all_blocking(&layers).unwrap().limit, 2);
    two.set_override_blocking(&tenant, "free", "4/minute", None)
        .unwrap();
    let d = one.check_all_blocking(&layers).unwrap();
    assert!(d.allowed && d.remaining == 2, "{d:?}");
    // `one` now holds version 1; `two` lowers it
    two.set_override_blocking(&tenant, "free", "2/minute", None)
        .unwrap();
    let d = one.check_all_blocking(&layers).unwrap();
    assert!(!d.allowed && d.limit == 2 && d.layer == Some(0), "{d:?}");
    // every retried call's admission on the other shard was given back: 2 consumed
    assert_eq!(one.peek_blocking(&addr, &ip).unwrap().remaining, 98);
    // deleted by `two`: the policy's limit (2, used up) decides for `one` too
    assert!(two.delete_override_blocking(&tenant, "free").unwrap());
    let d = one.check_all_blocking(&layers).unwrap();
    assert!(!d.allowed && d.limit == 2, "{d:?}");
    two.set_override_blocking(&tenant, "free", "9/minute", None)
        .unwrap();
    let d = one.check_all_blocking(&layers).unwrap();
    assert!(d.allowed && d.limit == 9 && d.remaining == 6, "{d:?}");
}

/// 64 concurrent layered callers on one tenant under an override, its layers and the
/// users' on two shards: exactly the override's limit is admitted, on both engines.
#[test]
fn sixty_four_concurrent_layered_callers_stay_exact() {
    let (a, b) = (RedisServer::start(), RedisServer::start());
    for (l, n) in engines(&a, &b) {
        let l = Arc::new(l);
        let tenant = key_on("tenant", 0, n);
        l.set_override_blocking(&tenant, "free", "30/minute; 25/hour", None)
            .unwrap();
        let (free, user) = (l.policy("free").unwrap(), l.policy("user").unwrap());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let allowed = rt.block_on(async {
            let tasks: Vec<_> = (0..64)
                .map(|i| {
                    let (l, free, user, tenant) =
                        (l.clone(), free.clone(), user.clone(), tenant.clone());
                    tokio::spawn(async move {
                        let layers = [
                            Layer::new(&tenant, &free, 1),
                            Layer::new(format!("u{i}"), &user, 1),
                        ];
                        l.check_all(&layers).await.unwrap().allowed
                    })
                })
                .collect();
            let mut n = 0;
            for t in tasks {
                n += usize::from(t.await.unwrap());
            }
            n
        });
        assert_eq!(allowed, 25);
        let d = l.peek_blocking(&tenant, &free).unwrap();
        assert_eq!((d.remaining, d.limit_index), (0, Some(1)), "{d:?}");
        // the denied callers' user layers were given back: one unit used where admitted
        let used: u64 = (0..64)
            .map(|i| 3 - l.peek_blocking(&format!("u{i}"), &user).unwrap().remaining)
            .sum();
        assert_eq!(used, 25);
    }
}

/// A Redis Cluster (three primaries): layered checks over keys of many slots, each layer of
/// a policy with overrides under the override another limiter set (multi-limit included),
/// its version compared in its slot's call, no CROSSSLOT.
#[test]
fn cluster_mode_layered_checks_follow_overrides() {
    let nodes = Cluster::start();
    let make = || {
        let l = Limiter::from_json(&nodes.config(2000, POLICIES)).unwrap();
        l.with_clock(ManualClock::new(T0)).unwrap()
    };
    let (a, b) = (make(), make());
    // the in-memory engine runs the same steps: the same decisions
    let m = memory(ManualClock::new(T0));
    let (free, user, ip) = (
        a.policy("free").unwrap(),
        a.policy("user").unwrap(),
        a.policy("ip").unwrap(),
    );
    let seen = |d: shardlimit::Decision| (d.allowed, d.limit, d.remaining, d.layer, d.limit_index);
    for i in 0..9 {
        let (tenant, person) = (format!("tenant:{i}"), format!("person:{i}"));
        let layers = [
            Layer::new(&tenant, &free, 1),
            Layer::new(&person, &user, 1),
            Layer::new(format!("ip:{i}"), &ip, 1),
        ];
        let d = a.check_all_blocking(&layers).unwrap();
        assert_eq!(d.limit, 2);
        assert_eq!(seen(d), seen(m.check_all_blocking(&layers).unwrap()));
        for l in [&b, &m] {
            l.set_override_blocking(&tenant, "free", "20/hour; 4/day", None)
                .unwrap();
            l.set_override_blocking(&person, "user", "9/hour", None)
                .unwrap();
        }
        let ds: Vec<_> = (0..6)
            .map(|_| seen(a.check_all_blocking(&layers).unwrap()))
            .collect();
        let want: Vec<_> = (0..6)
            .map(|_| seen(m.check_all_blocking(&layers).unwrap()))
            .collect();
        assert_eq!(ds, want, "{tenant}");
        // the override's daily limit (4) ends it, whatever the policy's counter held
        assert!(ds[..4].iter().all(|d| d.0) && !ds[5].0, "{ds:?}");
        assert_eq!((ds[5].1, ds[5].3, ds[5].4), (4, Some(0), Some(1)), "{ds:?}");
        let p = a.peek_blocking(&person, &user).unwrap();
        let q = m.peek_blocking(&person, &user).unwrap();
        assert_eq!((p.limit, p.remaining), (q.limit, q.remaining), "{person}");
        assert_eq!(p.limit, 9);
    }
}
