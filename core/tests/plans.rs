//! Multi-limit policies, rate strings in the config, and plans: the
//! config's forms and errors, exactness under 64 concurrent callers on both engines, and
//! how a multi-limit policy behaves in every path besides a plain check (headers, metrics,
//! fallback, leases, local admission, layered checks, reload). The decisions themselves are
//! the vectors of tests/vectors/plans.json (core/tests/vectors.rs).

mod support;

use serde_json::json;
use shardlimit::{Config, Decision, Layer, Limit, Limiter, ManualClock, Policy, Source};
use std::sync::Arc;
use std::time::Duration;

const T0: u64 = 1_700_006_400_000_000; // the start of a day (UTC), in µs
const HOUR: u64 = 3_600_000_000;

fn config_err(cfg: serde_json::Value) -> String {
    Config::from_value(&cfg).unwrap_err().to_string()
}

#[test]
fn the_config_forms_of_a_policy() {
    let cfg = Config::from_value(&json!({
        "default_algorithm": "sliding_window",
        "policies": {
            "login": "5/minute",
            "api": "10/second; 1000/day",
            "bucket": {"algorithm": "token_bucket", "rate": "100/minute", "on_error": "closed"},
            "both": {"limits": ["3/second", {"algorithm": "fixed_window", "limit": 10000, "window": "1d"}]},
            "plain": {"algorithm": "fixed_window", "limit": 1, "window": "1s"},
        }
    }))
    .unwrap();
    let p = &cfg.policies;
    assert_eq!(
        p["login"].limits(),
        [Limit::sliding_window(5, Duration::from_secs(60))]
    );
    assert!(!p["login"].is_multi());
    assert_eq!(
        p["api"].limits(),
        [
            Limit::sliding_window(10, Duration::from_secs(1)),
            Limit::sliding_window(1000, Duration::from_secs(86_400)),
        ]
    );
    assert_eq!(
        p["bucket"].limits(),
        [Limit::token_bucket(100, 100.0 / 60.0)]
    );
    assert_eq!(p["bucket"].on_error(), shardlimit::OnError::Closed);
    assert_eq!(
        p["both"].limits(),
        [
            Limit::sliding_window(3, Duration::from_secs(1)),
            Limit::fixed_window(10_000, Duration::from_secs(86_400)),
        ]
    );
    assert_eq!(p["plain"].limits().len(), 1);
    // fixed_window unless set
    let cfg = Config::from_value(&json!({"policies": {"login": "5/minute"}})).unwrap();
    assert_eq!(
        cfg.policies["login"].limits(),
        [Limit::fixed_window(5, Duration::from_secs(60))]
    );
    // the longest window of any limit (and of any plan) sets the reshard handoff
    let cfg = Config::from_value(&json!({
        "policies": {"api": "10/second; 1000/day"},
        "plans": {"x": {"api": "1/2 days"}}
    }))
    .unwrap();
    assert_eq!(
        cfg.effective_reshard_handoff(),
        Duration::from_secs(2 * 86_400)
    );
}

#[test]
fn config_errors_name_the_field_and_the_bad_part() {
    for (cfg, want) in [
        (
            json!({"policies": {"login": "5/fortnight"}}),
            "policies.login: the unit \"fortnight\"",
        ),
        (
            json!({"policies": {"login": {"rate": "five/minute"}}}),
            "policies.login.rate: the count \"five\"",
        ),
        (
            json!({"policies": {"l": {"limits": ["1/second", "2/eon"]}}}),
            "policies.l.limits[1]: the unit \"eon\"",
        ),
        (
            json!({"policies": {"l": {"rate": "1/second", "limit": 3}}}),
            "policies.l.limit: give either `rate`",
        ),
        (
            json!({"policies": {"l": {"rate": 5}}}),
            "policies.l.rate: expected a rate string",
        ),
        (
            json!({"policies": {"l": {"limits": ["1/second"], "algorithm": "fixed_window"}}}),
            "policies.l.algorithm: give the limits either in `limits`",
        ),
        (
            json!({"policies": {"l": {"limits": []}}}),
            "policies.l.limits: expected a non-empty list",
        ),
        (
            json!({"policies": {"l": {"limits": [{"rate": "1/second", "on_error": "open"}]}}}),
            "policies.l.limits[0].on_error",
        ),
        (
            json!({"policies": {"l": {"limits": ["1/second", {"algorithm": "concurrency", "max": 2, "lease_ttl": "1s"}]}}}),
            "policies.l.limits[1].algorithm: a concurrency limit cannot be part of a multi-limit policy",
        ),
        (
            json!({"policies": {"l": {"limits": ["1/second", "5/minute"], "local_admission": {}}}}),
            "policies.l.local_admission: local admission cannot apply to the multi-limit policy l",
        ),
        (
            json!({"policies": {"l": {"algorithm": "concurrency", "rate": "1/second"}}}),
            "policies.l.rate: a concurrency limit has no rate",
        ),
        (
            json!({"policies": {"l": {"window": "1s"}}}),
            "policies.l.algorithm: is required (or give a `rate`)",
        ),
        (
            json!({"policies": {"l": 5}}),
            "policies.l: expected a rate string",
        ),
        (
            json!({"default_algorithm": "concurrency", "policies": {}}),
            "default_algorithm: a concurrency limit has no rate",
        ),
        (
            json!({"default_algorithm": "gcra"}),
            "default_algorithm: unknown algorithm",
        ),
        (
            json!({"policies": {"api": "1/second"}, "plans": {"free": {"upload": "1/second"}}}),
            "plans.free.upload: no policy named \"upload\" in `policies`",
        ),
        (
            json!({"policies": {"api": "1/second"}, "plans": {"free": {"api": "1/sec"}}}),
            "plans.free.api: the unit \"sec\"",
        ),
        (
            json!({"policies": {"api": "1/second"}, "plans": {"free": {"api": {"rate": "1/second", "shade": 1}}}}),
            "plans.free.api.shade",
        ),
        (
            json!({"policies": {"api": "1/second"}, "plans": {"free": "10/second"}}),
            "plans.free: expected an object mapping policy names",
        ),
        (
            json!({"policies": {"api": "1/second"}, "plans": {"fr ee": {}}}),
            "plans.fr ee: plan name",
        ),
        (
            json!({"policies": {"api": {"rate": "10/second", "local_admission": {}}},
                   "plans": {"free": {"api": "1/second; 5/minute"}}}),
            "plans.free.api: policy api uses local_admission",
        ),
    ] {
        let e = config_err(cfg.clone());
        assert!(e.contains(want), "{cfg}: {e:?} does not contain {want:?}");
    }
}

#[test]
fn plans_resolve_under_the_policy_name() {
    let l = Limiter::from_json(
        &json!({
            "policies": {
                "api": {"rate": "2/second", "on_error": "closed",
                        "auto_block": {"after": 3, "within": "1m", "for": "5m"}},
                "upload": "1/second",
            },
            "plans": {"free": {"api": "1/second; 100/day"}, "pro": {"api": {"rate": "50/second", "on_error": "open"}}},
        })
        .to_string(),
    )
    .unwrap();
    let free = l.plan_policy("free", "api").unwrap();
    assert_eq!(free.name(), "api");
    assert!(free.is_multi());
    // what the plan does not set is the policy's own
    assert_eq!(free.on_error(), shardlimit::OnError::Closed);
    assert_eq!(free.auto_block(), l.policy("api").unwrap().auto_block());
    let pro = l.plan_policy("pro", "api").unwrap();
    assert_eq!(pro.on_error(), shardlimit::OnError::Open);
    // a policy the plan does not list is the policy itself
    assert_eq!(
        l.plan_policy("free", "upload").unwrap().limits(),
        l.policy("upload").unwrap().limits()
    );
    let e = l.plan_policy("gold", "api").unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
    assert!(
        e.to_string().contains("gold") && e.to_string().contains("free, pro"),
        "{e}"
    );
    let e = l.plan_policy("free", "nope").unwrap_err();
    assert_eq!(e.kind(), shardlimit::ErrorKind::UnknownPolicy);
}

fn multi_config() -> serde_json::Value {
    // a fixed window of 20 per hour and a bucket of 30 that practically never refills
    json!({"api": {"limits": [
        {"algorithm": "fixed_window", "limit": 20, "window": "1h"},
        {"algorithm": "token_bucket", "capacity": 30, "refill_per_sec": 0.00000004},
    ]}})
}

/// 64 threads, 3 checks each, at one instant: how many were allowed.
fn burst(l: &Limiter, p: &Policy) -> u64 {
    let allowed = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..64 {
            s.spawn(|| {
                for _ in 0..3 {
                    let d = l.check_blocking("k", p, 1).unwrap();
                    assert!(matches!(d.source, Source::Redis | Source::Memory), "{d:?}");
                    if d.allowed {
                        allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    allowed.into_inner()
}

/// Every limit stays exact: the window admits 20, then the bucket the 10 it has left (the
/// window's denials took nothing from it), then nothing while the next window, asked only
/// through denials of the bucket, keeps its whole budget.
fn exact_under_64_callers(l: Limiter, clock: Arc<ManualClock>) {
    let p = l.policy("api").unwrap();
    // (an ad-hoc policy named `api` is refused: the config's first limit is read instead)
    let window_only = p.parts().unwrap()[0].clone();
    assert_eq!(
        window_only.limit(),
        &Limit::fixed_window(20, Duration::from_secs(3600))
    );
    clock.set_us(T0);
    assert_eq!(burst(&l, &p), 20);
    let d = l.peek_blocking("k", &p).unwrap();
    assert_eq!((d.allowed, d.limit_index), (false, Some(0)));
    clock.set_us(T0 + HOUR);
    assert_eq!(burst(&l, &p), 10);
    // the same state as the first limit's (the first limit keeps the policy's scope)
    assert_eq!(l.peek_blocking("k", &window_only).unwrap().remaining, 10);
    clock.set_us(T0 + 2 * HOUR);
    assert_eq!(burst(&l, &p), 0);
    assert_eq!(l.peek_blocking("k", &window_only).unwrap().remaining, 20);
    let d = l.check_blocking("k", &p, 1).unwrap();
    assert_eq!((d.allowed, d.limit_index, d.limit), (false, Some(1), 30));
    let m = l.metrics();
    let api = m.policies.iter().find(|m| m.policy == "api").unwrap();
    // each check counted once, not once per limit
    assert_eq!((api.allowed, api.denied), (30, 3 * 3 * 64 - 30 + 1));
}

#[test]
fn exact_under_64_concurrent_callers_in_memory() {
    let clock = ManualClock::new(T0);
    let cfg = Config::from_value(&json!({"policies": multi_config()})).unwrap();
    let l = Limiter::new(cfg)
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    exact_under_64_callers(l, clock);
}

#[test]
fn exact_under_64_concurrent_callers_on_redis() {
    let server = support::RedisServer::start();
    let clock = ManualClock::new(T0);
    let cfg = support::config(&[&server], &multi_config().to_string());
    let l = Limiter::from_json(&cfg)
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    exact_under_64_callers(l, clock);
    // one state key per limit, with the layout of docs/keys.md
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .unwrap();
    keys.sort();
    assert!(keys.contains(&"sl:s:api#1:tb:{k}".to_string()), "{keys:?}");
    assert!(
        keys.iter().any(|k| k.starts_with("sl:s:api:fw:{k}:")),
        "{keys:?}"
    );
}

#[test]
fn one_script_call_per_check_on_redis() {
    let server = support::RedisServer::start();
    let cfg = support::config(&[&server], r#"{"api": "5/second; 100/minute; 1000/day"}"#);
    // the clock is injected: on the wall clock a second boundary inside the loop would refill
    // the 5/second limit and let the eighth check through
    let l = Limiter::from_json(&cfg)
        .unwrap()
        .with_clock(ManualClock::new(T0))
        .unwrap();
    let p = l.policy("api").unwrap();
    l.check_blocking("warm", &p, 1).unwrap(); // loads the script
    let calls = || server.script_calls();
    let before = calls();
    for _ in 0..7 {
        l.check_blocking("u", &p, 1).unwrap();
    }
    assert_eq!(calls() - before, 7);
    let d = l.check_blocking("u", &p, 1).unwrap();
    assert_eq!(d.limit_index, Some(0));
    assert_eq!(d.shard, Some(0));
    assert!(!d.allowed);
}

#[test]
fn headers_list_every_window_and_describe_the_decider() {
    let clock = ManualClock::new(T0);
    let l = Limiter::from_json(&json!({"policies": {"api": "2/second; 3/minute"}}).to_string())
        .unwrap()
        .with_clock(clock.clone())
        .unwrap();
    let p = l.policy("api").unwrap();
    let header = |d: &Decision, name: &str| {
        d.headers()
            .into_iter()
            .find(|(h, _)| *h == name)
            .map(|(_, v)| v)
    };
    let d = l.check_blocking("u", &p, 2).unwrap();
    assert_eq!(
        header(&d, "RateLimit-Policy").unwrap(),
        "\"api\";q=2;w=1, \"api#1\";q=3;w=60"
    );
    assert_eq!(header(&d, "RateLimit").unwrap(), "\"api\";r=0;t=1");
    clock.set_us(T0 + 1_000_000);
    let d = l.check_blocking("u", &p, 2).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.limit_index, Some(1));
    assert_eq!(header(&d, "RateLimit").unwrap(), "\"api#1\";r=1;t=59");
    assert_eq!(header(&d, "X-RateLimit-Limit").unwrap(), "3");
    assert_eq!(header(&d, "Retry-After").unwrap(), "59");
    assert_eq!(d.body()["policy"], "api");
    let j = d.to_json();
    assert_eq!(j["limit_index"], 1);
    assert_eq!(j["quotas"][0]["limit"], 2);
    assert_eq!(j["quotas"][1]["window_ms"], 60_000.0);
}

#[test]
fn what_a_multi_limit_policy_refuses_or_keeps() {
    let l = Limiter::memory();
    let p = Policy::multi(
        "api",
        vec![
            Limit::fixed_window(2, Duration::from_secs(1)),
            Limit::fixed_window(5, Duration::from_secs(60)),
        ],
    )
    .unwrap();
    // no leases
    let e = l.acquire_blocking("k", &p, 1).unwrap_err();
    assert!(e.to_string().contains("multi-limit"), "{e}");
    // key and cost rules as for any check
    assert!(l
        .check_blocking("", &p, 1)
        .unwrap_err()
        .is_invalid_argument());
    assert!(l
        .check_blocking("k", &p, 0)
        .unwrap_err()
        .is_invalid_argument());
    // scaling applies to every limit
    p.set_scale(0.5).unwrap();
    let d = l.check_blocking("k", &p, 1).unwrap();
    assert_eq!(d.quotas.iter().map(|q| q.limit).collect::<Vec<_>>(), [1, 2]);
    // a layered check counts each limit of a multi-limit layer
    let many: Vec<Layer> = (0..33)
        .map(|i| Layer::new(format!("k{i}"), &p, 1))
        .collect();
    let e = l.check_all_blocking(&many).unwrap_err();
    assert!(e.to_string().contains("at most 64 limits"), "{e}");
}

#[test]
fn on_error_decides_for_a_multi_limit_policy_once() {
    let port = support::free_port(); // nothing listens
    let cfg = json!({
        "timeout_ms": 200,
        "shards": [{"name": "s0", "url": format!("redis://127.0.0.1:{port}")}],
        "policies": {
            "open": "2/second; 3/minute",
            "closed": {"limits": ["2/second", "3/minute"], "on_error": "closed"},
            "local": {"limits": ["2/second", "3/minute"], "on_error": "local"},
        }
    });
    let l = Limiter::from_json(&cfg.to_string()).unwrap();
    let check = |name: &str| l.check_blocking("k", &l.policy(name).unwrap(), 1).unwrap();
    let d = check("open");
    assert!(d.allowed && d.source == Source::Fallback, "{d:?}");
    assert_eq!(d.quotas.len(), 2);
    let d = check("closed");
    assert!(!d.allowed && d.source == Source::Fallback, "{d:?}");
    // local: the in-process limiter holds every limit (one instance: all of each)
    let local: Vec<bool> = (0..4).map(|_| check("local").allowed).collect();
    assert_eq!(local, [true, true, false, false]);
    let m = l.metrics();
    let open = m.policies.iter().find(|m| m.policy == "open").unwrap();
    assert_eq!((open.redis_errors, open.fallback), (1, 1), "{open:?}");
}

#[test]
fn reload_reports_a_changed_limit_list() {
    let l = Limiter::from_json(&json!({"policies": {"api": "2/second; 3/minute"}}).to_string())
        .unwrap();
    let next = Config::from_value(&json!({"policies": {"api": "2/second; 5/minute"}})).unwrap();
    let report = l.reload(next).unwrap();
    assert_eq!(report.policies_changed, ["api"]);
    let d = l.check_blocking("k", &l.policy("api").unwrap(), 1).unwrap();
    assert_eq!(d.quotas[1].limit, 5);
}
