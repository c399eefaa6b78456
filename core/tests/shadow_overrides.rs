//! Shadow mode and per-key overrides on every policy shape: shadow
//! on a multi-limit policy, shadow with overrides, overrides on a multi-limit policy and
//! overrides of several limits, on both engines with an injected clock and on real Redis;
//! an override follows a later `set_scale`; `reset` clears an override's own state; 64
//! concurrent callers keep a multi-limit override exact.

mod support;

use shardlimit::{Config, Limiter, ManualClock};
use std::sync::Arc;
use support::RedisServer;

const T0: u64 = 1_700_000_000_000_000;

fn memory_at(policies: &str, clock: Arc<ManualClock>) -> Limiter {
    let cfg = Config::from_json(&format!(r#"{{"policies": {policies}}}"#)).unwrap();
    Limiter::new(cfg).unwrap().with_clock(clock).unwrap()
}

fn redis_at(server: &RedisServer, policies: &str, clock: Arc<ManualClock>) -> Limiter {
    let l = Limiter::from_json(&support::config(&[server], policies)).unwrap();
    l.with_clock(clock).unwrap()
}

fn redis(server: &RedisServer, policies: &str) -> Limiter {
    redis_at(server, policies, ManualClock::new(T0))
}

/// Both engines, each with its own clock at T0.
fn both_clocked(server: &RedisServer, policies: &str) -> [(Limiter, Arc<ManualClock>); 2] {
    let (a, b) = (ManualClock::new(T0), ManualClock::new(T0));
    [
        (memory_at(policies, a.clone()), a),
        (redis_at(server, policies, b.clone()), b),
    ]
}

fn both(server: &RedisServer, policies: &str) -> [Limiter; 2] {
    both_clocked(server, policies).map(|(l, _)| l)
}

const MULTI_SHADOW: &str = r#"{"m": {"limits": [
    {"algorithm": "fixed_window", "limit": 2, "window": "10s"},
    {"algorithm": "token_bucket", "capacity": 3, "refill_per_sec": 0.001}], "shadow": true}}"#;

#[test]
fn shadow_on_a_multi_limit_policy() {
    let server = RedisServer::start();
    for (l, clock) in both_clocked(&server, MULTI_SHADOW) {
        let p = l.policy("m").unwrap();
        let ds: Vec<_> = (0..4)
            .map(|_| l.check_blocking("k", &p, 1).unwrap())
            .collect();
        assert!(ds.iter().all(|d| d.allowed), "{ds:?}");
        let shadowed: Vec<bool> = ds.iter().map(|d| d.shadow_denied).collect();
        assert_eq!(shadowed, [false, false, true, true]);
        // the first limit would deny; nothing consumed in the second by a shadow denial
        assert_eq!(
            (ds[2].limit, ds[2].limit_index, ds[2].retry_after),
            (2, Some(0), None)
        );
        // a new window: the bucket holds what the two admitted checks left (3 - 2)
        clock.advance_us(10_000_000);
        let d = l.peek_blocking("k", &p).unwrap();
        assert_eq!(d.quotas.len(), 2);
        assert_eq!((d.remaining, d.limit_index), (1, Some(1)), "{d:?}");
        let r = l.shadow_report_blocking("m", None).unwrap();
        assert_eq!((r.total, r.keys.clone()), (2, vec![("k".to_string(), 2)]));
        let m = l.metrics();
        let pm = m.policies.iter().find(|x| x.policy == "m").unwrap();
        assert_eq!((pm.allowed, pm.denied, pm.shadow_denied), (4, 0, 2));
        // a would-be denial by the second limit is shadowed too
        let d = l.check_blocking("k2", &p, 4).unwrap();
        assert!(d.allowed && d.shadow_denied, "{d:?}");
        assert_eq!(
            d.limit_index,
            Some(0),
            "the first denying limit is described"
        );
    }
}

const SHADOW_OV: &str = r#"{"s": {"algorithm": "fixed_window", "limit": 2, "window": "1h",
    "overrides": true, "shadow": true}}"#;

#[test]
fn shadow_with_an_override_decided_by_the_override() {
    let server = RedisServer::start();
    for l in both(&server, SHADOW_OV) {
        let p = l.policy("s").unwrap();
        l.set_override_blocking("t", "s", "3/hour", None).unwrap();
        let ds: Vec<_> = (0..5)
            .map(|_| l.check_blocking("t", &p, 1).unwrap())
            .collect();
        assert!(ds.iter().all(|d| d.allowed));
        let shadowed: Vec<bool> = ds.iter().map(|d| d.shadow_denied).collect();
        assert_eq!(shadowed, [false, false, false, true, true]);
        assert_eq!(ds[3].limit, 3, "the override decides");
        // a multi-limit override, in shadow too
        l.set_override_blocking("u", "s", "1/minute; 10/hour", None)
            .unwrap();
        let ds: Vec<_> = (0..2)
            .map(|_| l.check_blocking("u", &p, 1).unwrap())
            .collect();
        assert!(
            ds[1].allowed && ds[1].shadow_denied && ds[1].limit == 1,
            "{ds:?}"
        );
        let r = l.shadow_report_blocking("s", None).unwrap();
        assert_eq!(r.total, 3);
        // a per-call shadow check of an enforcing policy with overrides
        let q = shardlimit::Policy::new(
            "q",
            shardlimit::Limit::fixed_window(1, std::time::Duration::from_secs(60)),
        )
        .unwrap();
        assert!(q.with_overrides().unwrap().with_shadow(true).is_ok());
    }
}

const MULTI_OV: &str = r#"{"api": {"rate": "2/second; 100/day", "overrides": true},
    "free": {"algorithm": "fixed_window", "limit": 1, "window": "1h", "overrides": true}}"#;

#[test]
fn overrides_on_multi_limit_policies_and_of_several_limits() {
    let server = RedisServer::start();
    for l in both(&server, MULTI_OV) {
        let api = l.policy("api").unwrap();
        let free = l.policy("free").unwrap();
        // a multi-limit policy's key under an override of one limit, then of several
        l.set_override_blocking("a", "api", "3/second", None)
            .unwrap();
        let n = (0..5)
            .filter(|_| l.check_blocking("a", &api, 1).unwrap().allowed)
            .count();
        assert_eq!(n, 3);
        l.set_override_blocking(
            "b",
            "api",
            r#"[{"limit": 4, "window": "1s"}, {"limit": 5, "window": "1d"}]"#,
            None,
        )
        .unwrap();
        let ds: Vec<_> = (0..6)
            .map(|_| l.check_blocking("b", &api, 1).unwrap())
            .collect();
        assert_eq!(ds.iter().filter(|d| d.allowed).count(), 4);
        assert_eq!((ds[5].limit, ds[5].quotas.len()), (4, 2));
        // the policy's own limits still hold for other keys
        let n = (0..5)
            .filter(|_| l.check_blocking("c", &api, 1).unwrap().allowed)
            .count();
        assert_eq!(n, 2);
        // a plain policy whose key gets several limits; deleting it brings the policy back
        l.set_override_blocking("f", "free", "5/hour; 2/minute", None)
            .unwrap();
        let n = (0..5)
            .filter(|_| l.check_blocking("f", &free, 1).unwrap().allowed)
            .count();
        assert_eq!(n, 2);
        assert!(l.delete_override_blocking("f", "free").unwrap());
        let d = l.check_blocking("f", &free, 1).unwrap();
        assert_eq!(d.limit, 1);
        // its state is the policy's own, untouched by the override's limits
        assert!(d.allowed, "{d:?}");
        // an override of several limits lists them all
        let o = l.get_override_blocking("b", "api").unwrap().unwrap();
        assert_eq!(o.limits.len(), 2);
        assert_eq!(o.to_json()["limits"].as_array().unwrap().len(), 2);
    }
}

/// Another limiter's override change reaches a multi-limit check through the version
/// compared in the layered script (no staleness).
#[test]
fn a_multi_limit_override_changed_by_another_process_applies_at_once() {
    let server = RedisServer::start();
    let (a, b) = (redis(&server, MULTI_OV), redis(&server, MULTI_OV));
    let api = b.policy("api").unwrap();
    a.set_override_blocking("t", "api", "1/second; 10/day", None)
        .unwrap();
    assert!(b.check_blocking("t", &api, 1).unwrap().allowed);
    assert!(!b.check_blocking("t", &api, 1).unwrap().allowed);
    a.set_override_blocking("t", "api", "3/second; 10/day", None)
        .unwrap();
    // b holds the old version cached; its next check finds the new one
    let d = b.check_blocking("t", &api, 1).unwrap();
    assert!(d.allowed && d.limit == 3, "{d:?}");
    a.delete_override_blocking("t", "api").unwrap();
    let d = b.check_blocking("t", &api, 1).unwrap();
    assert_eq!(d.limit, 2, "the policy's own limits again");
}

const SCALED: &str =
    r#"{"p": {"algorithm": "fixed_window", "limit": 10, "window": "1h", "overrides": true}}"#;

/// An override cached before `set_scale` follows the policy's new factor.
#[test]
fn a_cached_override_follows_a_later_set_scale() {
    let server = RedisServer::start();
    for l in both(&server, SCALED) {
        let p = l.policy("p").unwrap();
        l.set_override_blocking("k", "p", "20/hour", None).unwrap();
        assert_eq!(l.check_blocking("k", &p, 1).unwrap().limit, 20);
        p.set_scale(0.5).unwrap();
        assert_eq!(l.check_blocking("k", &p, 1).unwrap().limit, 10);
        l.set_override_blocking("m", "p", "20/hour; 40/day", None)
            .unwrap();
        assert_eq!(l.check_blocking("m", &p, 1).unwrap().limit, 10);
    }
}

const RESET: &str =
    r#"{"p": {"algorithm": "fixed_window", "limit": 2, "window": "1h", "overrides": true}}"#;

/// `reset` clears the state of the key's override when it keeps its own (another
/// algorithm, or several limits), not only the policy's.
#[test]
fn reset_clears_the_state_of_an_override_of_another_algorithm() {
    let server = RedisServer::start();
    for l in both(&server, RESET) {
        let p = l.policy("p").unwrap();
        for (key, value) in [
            (
                "k",
                r#"{"algorithm": "token_bucket", "capacity": 3, "refill_per_sec": 0.001}"#,
            ),
            ("m", "3/hour; 5/day"),
        ] {
            l.set_override_blocking(key, "p", value, None).unwrap();
            let n = (0..4)
                .filter(|_| l.check_blocking(key, &p, 1).unwrap().allowed)
                .count();
            assert_eq!(n, 3, "{value}");
            l.reset_blocking(key, &p).unwrap();
            let d = l.check_blocking(key, &p, 1).unwrap();
            assert!(d.allowed && d.remaining == 2, "{value}: {d:?}");
        }
    }
}

/// 64 concurrent callers on one key of a multi-limit policy under a multi-limit override,
/// on real Redis with the clock injected: exactly the override's tightest limit is admitted.
#[test]
fn sixty_four_concurrent_callers_keep_a_multi_limit_override_exact() {
    let server = RedisServer::start();
    let l = Arc::new(redis(&server, MULTI_OV));
    l.set_override_blocking("hot", "api", "40/second; 25/day", None)
        .unwrap();
    let api = l.policy("api").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let allowed = rt.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (l, api) = (l.clone(), api.clone());
                tokio::spawn(async move { l.check("hot", &api, 1).await.unwrap().allowed })
            })
            .collect();
        let mut n = 0;
        for t in tasks {
            n += usize::from(t.await.unwrap());
        }
        n
    });
    assert_eq!(allowed, 25);
    let d = l.check_blocking("hot", &api, 1).unwrap();
    assert!(!d.allowed && d.limit_index == Some(1), "{d:?}");
}

/// Charge, refund, reserve and settle act on every limit in force: under an override of
/// several limits (its own state, `name#o<i>`), and on a multi-limit policy that takes
/// overrides (its limits, or the key's override), never on one limit's state alone (both
/// engines, injected time).
#[test]
fn settle_ops_act_on_several_limits_under_overrides() {
    let server = RedisServer::start();
    const POLICIES: &str = r#"{"one": {"algorithm": "fixed_window", "limit": 5, "window": "1h", "overrides": true},
        "api": {"rate": "2/second; 100/day", "overrides": true}}"#;
    for l in both(&server, POLICIES) {
        let one = l.policy("one").unwrap();
        l.set_override_blocking("t", "one", "3/second; 4/day", None)
            .unwrap();
        // each op in both limits; the decision describes the tightest
        let d = l.charge_blocking("t", &one, 2).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (3, 1, Some(0)));
        assert_eq!(d.quotas.len(), 2, "{d:?}");
        let d = l.refund_blocking("t", &one, 1).unwrap();
        assert_eq!((d.limit, d.remaining), (3, 2), "{d:?}");
        // the 4/day limit holds 1 used: a reservation of 4 does not fit it
        let (d, r) = l.reserve_blocking("t", &one, 4).unwrap();
        assert!(!d.allowed && r.is_none(), "{d:?}");
        assert_eq!(d.limit_index, Some(0), "3/second denies first: {d:?}");
        let (d, r) = l.reserve_blocking("t", &one, 2).unwrap();
        let r = r.unwrap();
        assert!(d.allowed, "{d:?}");
        assert_eq!((d.limit, d.remaining, r.units), (3, 0, 2));
        // settled at 0: both limits get the 2 back (1 used in each)
        let d = l.settle_blocking(&r, 0).unwrap();
        assert_eq!((d.limit, d.remaining), (3, 2), "{d:?}");
        let d = l.check_blocking("t", &one, 1).unwrap();
        assert_eq!((d.limit, d.remaining, d.allowed), (3, 1, true), "{d:?}");
        // the 4/day limit was charged too: 2 used of it
        let d = l.charge_blocking("t", &one, 1).unwrap();
        assert_eq!(
            (d.limit, d.remaining, d.limit_index),
            (3, 0, Some(0)),
            "{d:?}"
        );
        assert_eq!(d.quotas[1].limit, 4);
        // the policy's own state of the key was never touched
        assert!(l.delete_override_blocking("t", "one").unwrap());
        assert_eq!(l.charge_blocking("t", &one, 1).unwrap().remaining, 4);
        // a key without an override is charged as before
        assert_eq!(l.charge_blocking("u", &one, 2).unwrap().remaining, 3);

        // a multi-limit policy that takes overrides: its limits, without an override
        let api = l.policy("api").unwrap();
        let d = l.charge_blocking("t", &api, 1).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (2, 1, Some(0)));
        let (d, r) = l.reserve_blocking("t", &api, 1).unwrap();
        assert!(d.allowed && d.remaining == 0, "{d:?}");
        assert!(!l.check_blocking("t", &api, 1).unwrap().allowed);
        let d = l.settle_blocking(&r.unwrap(), 0).unwrap();
        assert_eq!((d.limit, d.remaining), (2, 1), "{d:?}");
        // the key's override of several limits
        l.set_override_blocking("v", "api", "10/second; 20/day", None)
            .unwrap();
        let d = l.charge_blocking("v", &api, 5).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (10, 5, Some(0)));
        let (d, r) = l.reserve_blocking("v", &api, 5).unwrap();
        assert!(d.allowed && d.remaining == 0, "{d:?}");
        let d = l.settle_blocking(&r.unwrap(), 8).unwrap();
        // 5 + 8 used: 10/second in debt (remaining 0), 20/day has 7 left
        assert_eq!((d.limit, d.remaining, d.limit_index), (10, 0, Some(0)));
        assert_eq!(d.quotas[1].limit, 20);
        // 10 back in both: 3 used of each
        let d = l.refund_blocking("v", &api, 10).unwrap();
        assert_eq!(
            (d.limit, d.remaining, d.limit_index),
            (10, 7, Some(0)),
            "{d:?}"
        );
        let d = l.check_blocking("v", &api, 8).unwrap();
        assert!(!d.allowed && d.limit_index == Some(0), "{d:?}");
        // the key's override of one limit: that limit alone
        l.set_override_blocking("w", "api", "7/hour", None).unwrap();
        let d = l.charge_blocking("w", &api, 2).unwrap();
        assert_eq!((d.limit, d.remaining, d.limit_index), (7, 5, None));
    }
}
