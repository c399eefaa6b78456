//! Live per-key overrides (`limiter/overrides.rs`): the store and its API on both engines,
//! exact on the next check in every limiter sharing the shards (async, blocking and batch
//! calls), under 64 concurrent checks racing a change, and through fallback.

mod support;

use serde_json::json;
use shardlimit::{ErrorKind, Layer, Limit, Limiter, ManualClock, Source};
use std::sync::Arc;
use std::time::Duration;

const POLICIES: &str = r#"{
    "api": {"algorithm": "fixed_window", "limit": 10, "window": "1h", "overrides": true},
    "tb": {"algorithm": "token_bucket", "capacity": 5, "refill_per_sec": 1, "overrides": true},
    "cc": {"algorithm": "concurrency", "max": 2, "lease_ttl": "1m", "overrides": true},
    "plain": {"algorithm": "fixed_window", "limit": 10, "window": "1h"}
}"#;

fn memory(clock: &Arc<ManualClock>) -> Limiter {
    Limiter::from_json(&format!(r#"{{"policies": {POLICIES}}}"#))
        .unwrap()
        .with_clock(clock.clone())
        .unwrap()
}

fn redis(server: &support::RedisServer, clock: Option<&Arc<ManualClock>>) -> Limiter {
    let l = Limiter::from_json(&support::config(&[server], POLICIES)).unwrap();
    match clock {
        Some(c) => l.with_clock(c.clone()).unwrap(),
        None => l,
    }
}

fn minute(n: u64) -> Limit {
    Limit::fixed_window(n, Duration::from_secs(60))
}

/// The API on one limiter: set, get, check, delete, errors. Both engines.
fn store_and_api(l: &Limiter) {
    let p = l.policy("api").unwrap();
    // no override: the policy's limit
    assert_eq!(l.check_blocking("t1", &p, 1).unwrap().limit, 10);
    assert_eq!(l.get_override_blocking("t1", "api").unwrap(), None);
    // a rate string, in the policy's algorithm
    let info = l
        .set_override_blocking("t1", "api", "100/minute", None)
        .unwrap();
    assert_eq!(info.limit, minute(100));
    assert_eq!(info.remaining, None);
    // the same algorithm: the same counter (one used), the new limit
    let d = l.check_blocking("t1", &p, 1).unwrap();
    assert_eq!((d.limit, d.remaining, &*d.policy), (100, 98, "api"));
    assert!(d.allowed);
    // other keys keep the policy's limit
    assert_eq!(l.check_blocking("t2", &p, 1).unwrap().limit, 10);
    let got = l.get_override_blocking("t1", "api").unwrap().unwrap();
    assert_eq!(got.limit, minute(100));
    // a limit object in JSON, with a TTL; the algorithm may change (its own state)
    let info = l
        .set_override_blocking(
            "t1",
            "api",
            r#"{"algorithm": "token_bucket", "capacity": 3, "refill_per_sec": 0.5}"#,
            Some(Duration::from_secs(30)),
        )
        .unwrap();
    assert_eq!(info.limit, Limit::token_bucket(3, 0.5));
    let d = l.check_blocking("t1", &p, 1).unwrap();
    assert_eq!((d.limit, d.remaining, &*d.policy), (3, 2, "api"));
    let got = l.get_override_blocking("t1", "api").unwrap().unwrap();
    let left = got.remaining.unwrap();
    assert!(
        left <= Duration::from_secs(30) && left > Duration::from_secs(20),
        "{left:?}"
    );
    // deleted: the policy's limit again, on the state it had
    assert!(l.delete_override_blocking("t1", "api").unwrap());
    assert!(!l.delete_override_blocking("t1", "api").unwrap());
    let d = l.check_blocking("t1", &p, 1).unwrap();
    assert_eq!((d.limit, d.remaining), (10, 7));
    // a concurrency policy takes a concurrency limit
    let cc = l.policy("cc").unwrap();
    l.set_override_blocking("t1", "cc", r#"{"max": 5, "lease_ttl": "1m"}"#, None)
        .unwrap();
    let (d, lease) = l.acquire_blocking("t1", &cc, 4).unwrap();
    assert!(d.allowed && lease.is_some(), "{d:?}");
    assert_eq!(d.limit, 5);
    // errors name what is wrong
    let bad: &[(&str, &str, &str, &str)] = &[
        ("plain", "5/minute", "policy", "takes no per-key overrides"),
        ("nope", "5/minute", "", "nope"),
        ("api", "[]", "limit", "an array of 1 to 16"),
        (
            "api",
            "{\"rate\": \"5/minute; 100/day\"}",
            "limit.rate",
            "holds 2 limits",
        ),
        ("api", "pro", "limit", "nor a plan of the config"),
        ("api", "", "limit", "empty"),
        ("api", "{\"limit\": 5", "limit", "not valid JSON"),
        (
            "api",
            "{\"limit\": 0, \"window\": \"1m\"}",
            "limit",
            "between 1",
        ),
        ("api", "{\"limit\": 5}", "limit.window", "required"),
        (
            "api",
            "{\"limit\": 5, \"window\": \"1m\", \"x\": 1}",
            "limit.x",
            "unknown field",
        ),
        (
            "api",
            "{\"algorithm\": \"concurrency\", \"max\": 1, \"lease_ttl\": \"1s\"}",
            "limit",
            "not be a concurrency",
        ),
        ("cc", "5/minute", "limit", "not a rate"),
        ("api", "5/fortnight", "limit", "fortnight"),
    ];
    for (policy, value, field, why) in bad {
        let e = l
            .set_override_blocking("t9", policy, value, None)
            .unwrap_err();
        let msg = e.to_string();
        if *policy == "nope" {
            assert_eq!(e.kind(), ErrorKind::UnknownPolicy, "{msg}");
        } else {
            assert!(e.is_invalid_argument(), "{value}: {msg}");
            assert!(msg.contains(&format!("`{field}`")), "{value}: {msg}");
        }
        assert!(msg.contains(why), "{value}: {msg}");
    }
    for ttl in [Duration::ZERO, Duration::from_secs(400 * 86_400)] {
        let e = l
            .set_override_blocking("t9", "api", "5/minute", Some(ttl))
            .unwrap_err();
        assert!(e.to_string().contains("`ttl`"), "{e}");
    }
    assert!(l
        .set_override_blocking("", "api", "5/minute", None)
        .is_err());
    assert_eq!(l.get_override_blocking("t9", "api").unwrap(), None);
    // a layered check of a policy that takes overrides decides under the key's override
    l.set_override_blocking("t1", "api", "100/minute", None)
        .unwrap();
    let d = l.check_all_blocking(&[Layer::new("t1", &p, 1)]).unwrap();
    assert_eq!((d.limit, d.layer), (100, Some(0)), "{d:?}");
    assert!(l.delete_override_blocking("t1", "api").unwrap());
}

#[test]
fn memory_engine_store_and_api() {
    let clock = ManualClock::new(1_000_000);
    store_and_api(&memory(&clock));
}

#[test]
fn redis_engine_store_and_api() {
    let server = support::RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    store_and_api(&redis(&server, Some(&clock)));
}

#[test]
fn memory_engine_override_expires_with_its_ttl_on_the_injected_clock() {
    let clock = ManualClock::new(1_000_000);
    let l = memory(&clock);
    let p = l.policy("api").unwrap();
    l.set_override_blocking("t", "api", "50/hour", Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(l.check_blocking("t", &p, 1).unwrap().limit, 50);
    clock.set_us(1_000_000 + 9_999_999);
    assert_eq!(l.check_blocking("t", &p, 1).unwrap().limit, 50);
    clock.set_us(1_000_000 + 10_000_000);
    assert_eq!(l.check_blocking("t", &p, 1).unwrap().limit, 10);
    assert_eq!(l.get_override_blocking("t", "api").unwrap(), None);
}

#[test]
fn another_limiter_sees_a_change_on_its_very_next_check() {
    // two limiters are two processes: B has decided with the policy's limit (and then
    // with an override) before A changes it; B's next check, on every path, uses A's
    let server = support::RedisServer::start();
    let (a, b) = (redis(&server, None), redis(&server, None));
    let pb = b.policy("api").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (round, path) in ["blocking", "async", "batch"].iter().enumerate() {
        let key = format!("tenant:{round}");
        let check = |n: usize| -> Vec<shardlimit::Decision> {
            match *path {
                "blocking" => (0..n)
                    .map(|_| b.check_blocking(&key, &pb, 1).unwrap())
                    .collect(),
                "async" => (0..n)
                    .map(|_| rt.block_on(b.check(&key, &pb, 1)).unwrap())
                    .collect(),
                _ => rt.block_on(async {
                    // one burst: the pipe sends it as a batch script call
                    let calls = (0..n).map(|_| b.check(&key, &pb, 1));
                    futures_util::future::join_all(calls)
                        .await
                        .into_iter()
                        .map(|r| r.unwrap())
                        .collect()
                }),
            }
        };
        assert!(check(3).iter().all(|d| d.limit == 10));
        a.set_override_blocking(&key, "api", "1000/hour", None)
            .unwrap();
        let ds = check(4);
        assert!(
            ds.iter().all(|d| d.limit == 1000 && d.allowed),
            "{path}: {ds:?}"
        );
        let mut left: Vec<u64> = ds.iter().map(|d| d.remaining).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            vec![993, 994, 995, 996],
            "{path}: same counter, new limit"
        );
        // free → pro → free: moved back, denied at once (7 used of 10, then 3 more)
        a.set_override_blocking(&key, "api", "8/hour", None)
            .unwrap();
        let d = &check(1)[0];
        assert_eq!((d.limit, d.remaining, d.allowed), (8, 0, true), "{path}");
        assert!(!check(1)[0].allowed, "{path}");
        assert!(a.delete_override_blocking(&key, "api").unwrap());
        let d = &check(1)[0];
        assert_eq!((d.limit, d.allowed), (10, true), "{path}: {d:?}");
        // an entry that expired (as a TTL ends it in Redis: the key is gone)
        a.set_override_blocking(&key, "api", "500/hour", None)
            .unwrap();
        assert_eq!(check(1)[0].limit, 500);
        redis::cmd("FLUSHALL").exec(&mut server.conn()).unwrap();
        assert_eq!(check(1)[0].limit, 10, "{path}");
    }
}

#[test]
fn sixty_four_checks_racing_an_override_change_stay_exact() {
    let server = support::RedisServer::start();
    let (a, b) = (redis(&server, None), redis(&server, None));
    let pa = a.policy("api").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for (round, (from, to)) in [(10u64, 30u64), (30, 10)].iter().enumerate() {
        let key = format!("race:{round}");
        if *from != 10 {
            a.set_override_blocking(&key, "api", &format!("{from}/hour"), None)
                .unwrap();
        }
        let ds: Vec<shardlimit::Decision> = rt.block_on(async {
            let checks: Vec<_> = (0..64)
                .map(|_| {
                    let (a, pa, key) = (a.clone(), pa.clone(), key.clone());
                    tokio::spawn(async move { a.check(&key, &pa, 1).await.unwrap() })
                })
                .collect();
            let (b, key2) = (b.clone(), key.clone());
            let to = *to;
            let change = tokio::spawn(async move {
                tokio::task::yield_now().await;
                b.set_override(&key2, "api", &format!("{to}/hour"), None)
                    .await
                    .unwrap()
            });
            let mut out = Vec::new();
            for c in checks {
                out.push(c.await.unwrap());
            }
            change.await.unwrap();
            out
        });
        // every check was decided by the old limit or the new one, never a mix: each
        // admitted unit took the counter one higher, and the limit it was decided with
        // allowed that count
        support::assert_decided_by_one_limit(&ds, *from, *to, Source::Redis);
        // after set_override returned, no check uses the old limit, in either limiter
        for l in [&a, &b] {
            let p = l.policy("api").unwrap();
            let d = l.check_blocking(&key, &p, 1).unwrap();
            assert_eq!(d.limit, *to, "{d:?}");
            let d = rt.block_on(l.check(&key, &p, 1)).unwrap();
            assert_eq!(d.limit, *to, "{d:?}");
        }
    }
}

#[test]
fn an_override_survives_a_shard_outage_in_the_fallback() {
    // on_error local: the fallback decides with the override this process knows
    let mut server = support::RedisServer::start();
    let cfg = format!(
        r#"{{"timeout_ms": 300, "on_error": "local", "instances": 1,
            "shards": [{{"name": "s0", "url": "{}"}}], "policies": {POLICIES}}}"#,
        server.url()
    );
    let l = Limiter::from_json(&cfg).unwrap();
    let p = l.policy("api").unwrap();
    l.set_override_blocking("t", "api", "40/hour", None)
        .unwrap();
    assert_eq!(l.check_blocking("t", &p, 1).unwrap().limit, 40);
    server.kill();
    let d = l.check_blocking("t", &p, 1).unwrap();
    assert_eq!((d.source, d.limit), (Source::LocalFallback, 40), "{d:?}");
    let d = l.check_blocking("other", &p, 1).unwrap();
    assert_eq!((d.source, d.limit), (Source::LocalFallback, 10), "{d:?}");
}

/// Lists every page of `policy`'s overrides.
fn list_all(l: &Limiter, policy: &str, page: usize) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let p = l
            .list_overrides_blocking(policy, cursor.as_deref(), page)
            .unwrap();
        assert!(
            p.overrides.len() <= 2 * page + 1_000,
            "a page stays bounded"
        );
        for o in p.overrides {
            assert_eq!(o.policy, policy);
            keys.push(o.key);
        }
        match p.cursor {
            Some(c) => cursor = Some(c),
            None => {
                keys.sort();
                return keys;
            }
        }
    }
    panic!("the listing never ended");
}

fn listing(l: &Limiter) {
    let mut want: Vec<String> = (0..250).map(|i| format!("tenant:{i}")).collect();
    want.push("{acme}:user:1".into());
    want.push("a}b".into());
    for k in &want {
        l.set_override_blocking(k, "api", "20/minute", None)
            .unwrap();
    }
    l.set_override_blocking("elsewhere", "tb", "20/minute", None)
        .unwrap();
    want.sort();
    for page in [1, 7, 100, 10_000] {
        assert_eq!(list_all(l, "api", page), want, "page {page}");
    }
    assert_eq!(list_all(l, "tb", 10), vec!["elsewhere".to_string()]);
    let e = l.list_overrides_blocking("api", None, 0).unwrap_err();
    assert!(e.to_string().contains("`limit`"), "{e}");
    let e = l
        .list_overrides_blocking("api", Some("bogus"), 10)
        .unwrap_err();
    assert!(e.to_string().contains("`cursor`"), "{e}");
    let e = l.list_overrides_blocking("plain", None, 10).unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
}

#[test]
fn listing_pages_through_every_shard() {
    let servers = [support::RedisServer::start(), support::RedisServer::start()];
    let l = Limiter::from_json(&support::config(&[&servers[0], &servers[1]], POLICIES)).unwrap();
    listing(&l);
    let e = l
        .list_overrides_blocking("api", Some("r:9:0"), 10)
        .unwrap_err();
    assert!(e.to_string().contains("`cursor`"), "{e}");
}

#[test]
fn listing_in_memory() {
    listing(&memory(&ManualClock::new(1)));
}

#[test]
fn a_policy_without_overrides_reads_no_override_key() {
    // the cost of the feature when it is off: the check script of such a policy is told
    // not to read the entry, so an entry someone wrote by hand changes nothing
    let server = support::RedisServer::start();
    let l = redis(&server, None);
    let p = l.policy("plain").unwrap();
    let entry = format!(
        "7 {}",
        json!({"algorithm": "fixed_window", "limit": 99, "window": "1h"})
    );
    redis::cmd("SET")
        .arg(shardlimit::keys::override_key("sl:", "plain", "t"))
        .arg(entry)
        .exec(&mut server.conn())
        .unwrap();
    assert_eq!(l.check_blocking("t", &p, 1).unwrap().limit, 10);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(l.check("t", &p, 1)).unwrap().limit, 10);
}

#[test]
fn overrides_and_local_admission_are_refused_together() {
    let e = Limiter::from_json(
        r#"{"policies": {"x": {"algorithm": "fixed_window", "limit": 10, "window": "1m",
            "overrides": true, "local_admission": {"max_batch": 5}}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("policies.x.overrides"), "{e}");
    let e = Limiter::from_json(
        r#"{"policies": {"x": {"algorithm": "fixed_window", "limit": 10, "window": "1m",
            "overrides": "yes"}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("policies.x.overrides"), "{e}");
}

/// A plan name as the override: the limit that plan gives the policy, on both engines; a
/// plan giving it several limits replaces the key's limit with those limits.
#[test]
fn a_plan_name_overrides_with_that_plans_limit() {
    const PLANNED: &str = r#"{
        "api": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "overrides": true}
    }, "plans": {
        "pro": {"api": {"algorithm": "fixed_window", "limit": 5, "window": "1h"}},
        "max": {"api": "10/hour; 100/day"}
    }"#;
    let server = support::RedisServer::start();
    let clock = ManualClock::new(1_700_000_000_000_000);
    let on_memory = Limiter::from_json(&format!(r#"{{"policies": {PLANNED}}}"#))
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    let on_redis = Limiter::from_json(&support::config(&[&server], PLANNED))
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    for l in [&on_memory, &on_redis] {
        let p = l.policy("api").unwrap();
        l.set_override_blocking("tenant:1", "api", "pro", None)
            .unwrap();
        let allowed: Vec<bool> = (0..6)
            .map(|_| l.check_blocking("tenant:1", &p, 1).unwrap().allowed)
            .collect();
        assert_eq!(allowed, [true, true, true, true, true, false]);
        assert_eq!(l.check_blocking("tenant:1", &p, 1).unwrap().limit, 5);
        // the others keep the policy's own limit
        assert_eq!(l.check_blocking("tenant:2", &p, 1).unwrap().limit, 2);
        let info = l
            .set_override_blocking("tenant:1", "api", "max", None)
            .unwrap();
        assert_eq!(info.limits.len(), 2);
        // 10/hour and 100/day: limit 0 keeps its own state (new scope), so 10 more
        let allowed = (0..11)
            .filter(|_| l.check_blocking("tenant:1", &p, 1).unwrap().allowed)
            .count();
        assert_eq!(allowed, 10);
        let d = l.check_blocking("tenant:1", &p, 1).unwrap();
        assert_eq!((d.limit, d.limit_index, d.quotas.len()), (10, Some(0), 2));
        let got = l.get_override_blocking("tenant:1", "api").unwrap().unwrap();
        assert_eq!(got.limits, info.limits);
    }
}
