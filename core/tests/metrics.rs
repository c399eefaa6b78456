//! Metrics belong to the limiter: one series per policy name, counts that two limiters
//! sharing a `Policy` never mix, and a reload that keeps every count. The Prometheus text
//! is parsed, and a series that appears twice fails the test (an invalid exposition).

use shardlimit::{Limit, Limiter, Policy};
use std::collections::HashMap;
use std::time::Duration;

/// Every sample of a Prometheus text by `name{labels}`; panics on a series seen twice.
fn samples(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        assert!(
            out.insert(series.to_string(), value).is_none(),
            "series {series} appears twice in:\n{text}"
        );
    }
    out
}

fn allowed(l: &Limiter, policy: &str) -> f64 {
    let s = samples(&l.metrics().to_prometheus());
    s.get(&format!("shardlimit_allowed_total{{policy=\"{policy}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

const CONFIG: &str =
    r#"{"policies": {"api": {"algorithm": "fixed_window", "limit": 100, "window": "1m"}}}"#;

#[test]
fn ad_hoc_limits_share_one_series_per_distinct_limit() {
    let l = Limiter::memory();
    let limit = Limit::fixed_window(10, Duration::from_secs(60));
    // each call builds its policy afresh, as a binding's ad-hoc check does
    for i in 0..3 {
        let p = Policy::try_from(limit.clone()).unwrap();
        assert!(l.check_blocking(&format!("k{i}"), &p, 1).unwrap().allowed);
    }
    let other = Policy::try_from(Limit::fixed_window(20, Duration::from_secs(60))).unwrap();
    l.check_blocking("k", &other, 1).unwrap();
    assert_eq!(allowed(&l, &limit.id()), 3.0);
    assert_eq!(
        allowed(&l, &Limit::fixed_window(20, Duration::from_secs(60)).id()),
        1.0
    );
    assert_eq!(l.metrics().policies.len(), 2, "{:?}", l.metrics().policies);
}

#[test]
fn two_limiters_sharing_a_policy_count_apart() {
    let p = Policy::new("shared", Limit::fixed_window(10, Duration::from_secs(60))).unwrap();
    let (a, b) = (Limiter::memory(), Limiter::memory());
    for _ in 0..2 {
        a.check_blocking("k", &p, 1).unwrap();
    }
    b.check_blocking("k", &p, 1).unwrap();
    assert_eq!(allowed(&a, "shared"), 2.0);
    assert_eq!(allowed(&b, "shared"), 1.0);
}

#[test]
fn a_reload_keeps_the_counts() {
    let l = Limiter::from_json(CONFIG).unwrap();
    let api = l.policy("api").unwrap();
    l.check_blocking("k", &api, 1).unwrap();
    l.check_by_name_blocking("k", "api", 1).unwrap();
    l.reload(shardlimit::Config::from_json(CONFIG).unwrap())
        .unwrap();
    assert_eq!(allowed(&l, "api"), 2.0, "the reload reset the counters");
    // the policy of the new config, and the one held from before, count in one series
    l.check_by_name_blocking("k", "api", 1).unwrap();
    l.check_blocking("k", &api, 1).unwrap();
    assert_eq!(allowed(&l, "api"), 4.0);
    // removed by a reload: its count stays (a caller may still hold the policy)
    l.reload(shardlimit::Config::from_json(r#"{"policies": {}}"#).unwrap())
        .unwrap();
    assert_eq!(allowed(&l, "api"), 4.0);
    l.check_blocking("k", &api, 1).unwrap();
    assert_eq!(allowed(&l, "api"), 5.0);
    // and back in the config: still the same series
    l.reload(shardlimit::Config::from_json(CONFIG).unwrap())
        .unwrap();
    l.check_by_name_blocking("k", "api", 1).unwrap();
    assert_eq!(allowed(&l, "api"), 6.0);
}

/// An ad-hoc policy named like a configured one would count in (and spend) that policy's
/// series and state: refused, and nothing is counted.
#[test]
fn an_ad_hoc_policy_named_like_a_config_policy_is_refused() {
    let l = Limiter::from_json(CONFIG).unwrap();
    let adhoc = Policy::new("api", Limit::fixed_window(5, Duration::from_secs(60))).unwrap();
    let e = l.check_blocking("k", &adhoc, 1).unwrap_err();
    assert!(e.is_invalid_argument(), "{e}");
    l.check_by_name_blocking("k", "api", 1).unwrap();
    assert_eq!(allowed(&l, "api"), 1.0);
}

/// A policy keeps the counters of the first limiter that counts it, and the two
/// counters every check adds to are striped per thread. Counts stay exact from many
/// threads at once, a second limiter (and one made after the first is gone) still counts
/// apart, and denials count too.
#[test]
fn counts_from_many_threads_are_exact_and_limiters_still_count_apart() {
    let p = Policy::new(
        "hot",
        Limit::fixed_window(30_000, Duration::from_secs(3600)),
    )
    .unwrap();
    let (a, b) = (Limiter::memory(), Limiter::memory());
    std::thread::scope(|s| {
        for t in 0..6 {
            let (a, b, p) = (&a, &b, &p);
            s.spawn(move || {
                for i in 0..10_000 {
                    // a's checks fill the window and are denied past it; b's are not
                    a.check_blocking("k", p, 1).unwrap();
                    if t % 2 == 0 {
                        b.check_blocking(&format!("k{i}"), p, 1).unwrap();
                    }
                }
            });
        }
    });
    let series = |l: &Limiter| {
        let m = l.metrics();
        let s = m.policies.iter().find(|s| s.policy == "hot").unwrap();
        (s.allowed, s.denied)
    };
    assert_eq!(series(&a), (30_000, 30_000));
    assert_eq!(series(&b), (30_000, 0));
    drop(a);
    let c = Limiter::memory();
    c.check_blocking("k", &p, 1).unwrap();
    assert_eq!(series(&c), (1, 0), "a new limiter counts in its own series");
    assert_eq!(series(&b), (30_000, 0));
}
