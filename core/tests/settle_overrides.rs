//! Charge, refund, reserve and settle under several limits in force: an
//! override changed (by another limiter on Redis) between reserve and settle, or between
//! two charges, is learned and acted on; 64 concurrent charge/settle callers on an override
//! of several limits stay exact; and 64 checks racing an override change on the in-memory
//! engine (the Redis race is in `overrides.rs`). Both engines, injected time, real Redis.

mod support;

use shardlimit::{Decision, Limiter, ManualClock, Source};
use std::sync::Barrier;
use support::RedisServer;

const T0: u64 = 1_700_000_000_000_000;

const POLICIES: &str = r#"{
    "one": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "overrides": true},
    "api": {"rate": "2/second; 100/day", "overrides": true}
}"#;

fn memory() -> Limiter {
    let cfg = format!(r#"{{"policies": {POLICIES}}}"#);
    Limiter::from_json(&cfg)
        .unwrap()
        .with_clock(ManualClock::new(T0))
        .unwrap()
}

fn redis(server: &RedisServer) -> Limiter {
    Limiter::from_json(&support::config(&[server], POLICIES))
        .unwrap()
        .with_clock(ManualClock::new(T0))
        .unwrap()
}

/// `a` acts, `b` changes overrides: on Redis two limiters sharing the server (each with
/// its own cache of overrides), in memory the one limiter.
fn changed_between(a: &Limiter, b: &Limiter) {
    let one = a.policy("one").unwrap();
    // an override of several limits replaced by another one between reserve and settle:
    // the settle acts on the new limits (the same state, `one#o<i>`)
    a.set_override_blocking("k1", "one", "3/second; 4/day", None)
        .unwrap();
    let (d, r) = a.reserve_blocking("k1", &one, 2).unwrap();
    assert_eq!((d.limit, d.remaining), (3, 1), "{d:?}");
    b.set_override_blocking("k1", "one", "6/second; 8/day", None)
        .unwrap();
    let d = a.settle_blocking(&r.unwrap(), 0).unwrap();
    assert_eq!((d.limit, d.remaining, d.quotas.len()), (6, 6, 2), "{d:?}");
    let d = a.check_blocking("k1", &one, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (6, 5), "{d:?}");

    // no override, then one of several limits: the next charge acts on them
    assert_eq!(a.charge_blocking("k2", &one, 1).unwrap().remaining, 4);
    b.set_override_blocking("k2", "one", "3/second; 4/day", None)
        .unwrap();
    let d = a.charge_blocking("k2", &one, 1).unwrap();
    assert_eq!((d.limit, d.remaining, d.quotas.len()), (3, 2, 2), "{d:?}");

    // an override of several limits deleted between reserve and settle: the policy's limit
    // is settled (its state never held the reserved units: nothing above the limit)
    a.set_override_blocking("k3", "one", "3/second; 4/day", None)
        .unwrap();
    let (_, r) = a.reserve_blocking("k3", &one, 2).unwrap();
    assert!(b.delete_override_blocking("k3", "one").unwrap());
    let d = a.settle_blocking(&r.unwrap(), 3).unwrap();
    assert_eq!((d.limit, d.remaining, d.limit_index), (5, 4, None), "{d:?}");

    // a multi-limit policy with overrides: its limits, then the key's override of several
    let api = a.policy("api").unwrap();
    let (d, r) = a.reserve_blocking("k4", &api, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (2, 1), "{d:?}");
    b.set_override_blocking("k4", "api", "10/second; 20/day", None)
        .unwrap();
    // (the override's state is its own: the give-back finds nothing reserved there)
    let d = a.settle_blocking(&r.unwrap(), 2).unwrap();
    assert_eq!((d.limit, d.remaining), (10, 9), "{d:?}");
    let d = a.charge_blocking("k4", &api, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (10, 8), "{d:?}");
    // and back to the policy's limits, whose state kept its reserved unit
    assert!(b.delete_override_blocking("k4", "api").unwrap());
    let d = a.refund_blocking("k4", &api, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (2, 2), "{d:?}");
}

#[test]
fn an_override_changed_between_reserve_and_settle_in_memory() {
    let l = memory();
    changed_between(&l, &l);
}

#[test]
fn an_override_changed_between_reserve_and_settle_by_another_limiter() {
    let server = RedisServer::start();
    let (a, b) = (redis(&server), redis(&server));
    changed_between(&a, &b);
}

/// 64 callers charging, then 64 reserving and settling, at once on one key whose override
/// holds two limits: every unit counted once in each.
fn sixty_four_callers_stay_exact(l: &Limiter, rt: &tokio::runtime::Runtime) {
    let one = l.policy("one").unwrap();
    l.set_override_blocking("hot", "one", "1000/hour; 2000/day", None)
        .unwrap();
    let ds: Vec<Decision> = rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (l, one) = (l.clone(), one.clone());
                tokio::spawn(async move { l.charge("hot", &one, 1).await.unwrap() })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    // each charge saw the counter one higher: 999 down to 936, each once
    let mut left: Vec<u64> = ds.iter().map(|d| d.remaining).collect();
    left.sort_unstable();
    assert_eq!(left, (936..=999).collect::<Vec<_>>());
    assert!(ds.iter().all(|d| d.limit == 1000 && d.quotas.len() == 2));
    rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (l, one) = (l.clone(), one.clone());
                tokio::spawn(async move {
                    let (d, r) = l.reserve("hot", &one, 3).await.unwrap();
                    assert!(d.allowed, "{d:?}");
                    l.settle(&r.unwrap(), 1).await.unwrap()
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    // 64 charged, 64 settled at 1: 128 used of each limit
    let d = l.peek_blocking("hot", &one).unwrap();
    assert_eq!(
        (d.limit, d.remaining, d.limit_index),
        (1000, 872, Some(0)),
        "{d:?}"
    );
    let d = l.charge_blocking("hot", &one, 1).unwrap();
    assert_eq!(d.quotas[1].limit, 2000);
    // the day limit: 2000 - 129 left, seen through an override of it alone
    l.set_override_blocking("hot", "one", "5000/hour; 2000/day", None)
        .unwrap();
    let d = l.peek_blocking("hot", &one).unwrap();
    assert_eq!((d.limit, d.remaining), (2000, 1871), "{d:?}");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sixty_four_charge_and_settle_callers_on_an_override_of_several_limits_in_memory() {
    sixty_four_callers_stay_exact(&memory(), &runtime());
}

#[test]
fn sixty_four_charge_and_settle_callers_on_an_override_of_several_limits_on_redis() {
    let server = RedisServer::start();
    sixty_four_callers_stay_exact(&redis(&server), &runtime());
}

/// 64 checks racing an override change on the in-memory engine: every check decided by
/// the old limit or the new one over the one counter, each admitted unit counted once,
/// and the new limit in force once `set_override` returned.
#[test]
fn sixty_four_checks_racing_an_override_change_in_memory_stay_exact() {
    let l = memory();
    let p = l.policy("one").unwrap();
    for (round, (from, to)) in [(5u64, 30u64), (30, 5)].iter().enumerate() {
        let key = format!("race:{round}");
        if *from != 5 {
            l.set_override_blocking(&key, "one", &format!("{from}/hour"), None)
                .unwrap();
        }
        let start = Barrier::new(65);
        let ds: Vec<Decision> = std::thread::scope(|s| {
            let checks: Vec<_> = (0..64)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        l.check_blocking(&key, &p, 1).unwrap()
                    })
                })
                .collect();
            s.spawn(|| {
                start.wait();
                l.set_override_blocking(&key, "one", &format!("{to}/hour"), None)
                    .unwrap();
            })
            .join()
            .unwrap();
            checks.into_iter().map(|c| c.join().unwrap()).collect()
        });
        support::assert_decided_by_one_limit(&ds, *from, *to, Source::Memory);
        assert_eq!(l.check_blocking(&key, &p, 1).unwrap().limit, *to);
    }
}

/// A key's override follows its policy's scale in reserve and charge as in a check: the
/// override learnt before the scale changed is scaled with the policy after it.
#[test]
fn reserve_and_charge_under_an_override_follow_the_policys_scale() {
    let server = RedisServer::start();
    let l = redis(&server);
    let one = l.policy("one").unwrap();
    l.set_override_blocking("k", "one", "10/hour", None)
        .unwrap();
    let (d, _) = l.reserve_blocking("k", &one, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (10, 9), "{d:?}");
    l.set_scale(0.5, &["one"]).unwrap();
    let (d, _) = l.reserve_blocking("k", &one, 1).unwrap();
    assert_eq!(d.limit, 5, "{d:?}");
    let d = l.charge_blocking("k", &one, 1).unwrap();
    assert_eq!(d.limit, 5, "{d:?}");
    let d = l.check_blocking("k", &one, 1).unwrap();
    assert_eq!(d.limit, 5, "{d:?}");
}
