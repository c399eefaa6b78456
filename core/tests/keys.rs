//! Key layout: user keys, policy names and the library's own namespaces never share state
//! on real Redis and on the in-memory engine alike.

mod support;

use shardlimit::{Layer, Limit, Limiter, Policy, Source};
use std::time::Duration;
use support::RedisServer;

fn engines(server: &RedisServer) -> Vec<(&'static str, Limiter)> {
    vec![
        (
            "redis",
            Limiter::from_json(&support::config(&[server], "{}")).unwrap(),
        ),
        ("memory", Limiter::memory()),
    ]
}

fn hour() -> Duration {
    Duration::from_secs(3600)
}

#[test]
fn braced_and_bare_key_are_two_budgets() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let p = Policy::new("two", Limit::fixed_window(2, hour())).unwrap();
        assert!(l.check_blocking("u", &p, 1).unwrap().allowed, "{engine}");
        assert!(l.check_blocking("u", &p, 1).unwrap().allowed, "{engine}");
        assert!(!l.check_blocking("u", &p, 1).unwrap().allowed, "{engine}");
        let d = l.check_blocking("{u}", &p, 1).unwrap();
        assert!(d.allowed, "{engine}: {{u}} was charged for u");
        assert_eq!(d.remaining, 1, "{engine}");
        // and one block entry each
        l.block_blocking("u", None, "test").unwrap();
        assert!(l.blocked_blocking("u").unwrap().is_some(), "{engine}");
        assert!(l.blocked_blocking("{u}").unwrap().is_none(), "{engine}");
        assert!(l.check_blocking("{u}", &p, 1).unwrap().allowed, "{engine}");
    }
}

#[test]
fn layered_bare_and_braced_key_are_charged_once_each() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let p = Policy::new("lay", Limit::token_bucket(10, 1.0 / 3600.0)).unwrap();
        let d = l
            .check_all_blocking(&[Layer::new("w", &p, 1), Layer::new("{w}", &p, 1)])
            .unwrap();
        assert!(d.allowed, "{engine}");
        assert_eq!(l.peek_blocking("w", &p).unwrap().remaining, 9, "{engine}");
        assert_eq!(l.peek_blocking("{w}", &p).unwrap().remaining, 9, "{engine}");
    }
}

#[test]
fn a_policy_named_block_cannot_reach_the_block_list() {
    let server = RedisServer::start();
    for (engine, l) in engines(&server) {
        let victim = Policy::new("block", Limit::token_bucket(2, 1.0 / 3600.0)).unwrap();
        assert!(l.check_blocking("victim", &victim, 2).unwrap().allowed);
        assert!(!l.check_blocking("victim", &victim, 1).unwrap().allowed);
        // unblocking the key that spells the victim's state must not refill the bucket
        l.unblock_blocking("tb:{victim}").unwrap();
        let d = l.check_blocking("victim", &victim, 1).unwrap();
        assert!(!d.allowed, "{engine}: unblock refilled the victim's bucket");
        // blocking it must not break the victim's checks (nor unlimit them under `open`)
        l.block_blocking("tb:{victim}", None, "x").unwrap();
        let d = l.check_blocking("victim", &victim, 1).unwrap();
        assert!(!d.allowed, "{engine}");
        assert_eq!(d.remaining, 0, "{engine}");
        let want = if engine == "redis" {
            Source::Redis
        } else {
            Source::Memory
        };
        assert_eq!(
            d.source, want,
            "{engine}: the check failed instead of deciding"
        );
    }
}
